package discovery

import (
	"strings"

	"kvrouter/internal/config"
)

// role maps a Pod's role label to an engine role: "prefill" is a prefill
// engine; "decode", "prefill-decode", "both" or no label a decode engine
// (one that may also prefill locally, as llm-d's decode filter takes
// them). Another value is reported to bad and taken as decode. label ""
// (roles off) gives "".
func role(labels map[string]string, label string, bad func(value string)) string {
	if label == "" {
		return ""
	}
	v, ok := labels[label]
	switch strings.TrimSpace(v) {
	case config.RolePrefill:
		return config.RolePrefill
	case config.RoleDecode, "prefill-decode", "both":
		return config.RoleDecode
	case "":
		if ok {
			bad(v)
		}
		return config.RoleDecode
	default:
		bad(v)
		return config.RoleDecode
	}
}
