package discovery

import "strings"

// Engine roles of disaggregated prefill/decode (Engine.Role), as
// router.yaml's engines name them (docs/pd.md).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// DefaultRoleLabel is Config.RoleLabel's default: llm-d's P/D role label
// (llm-d/llm-d-inference-scheduler pkg/plugins/filter/pd_role.go:
// RoleLabel "llm-d.ai/role", values prefill, decode, prefill-decode and
// the older both; its decode filter also takes Pods without the label).
const DefaultRoleLabel = "llm-d.ai/role"

// RoleLabelOff as Config.RoleLabel turns roles off: every engine serves
// whole requests.
const RoleLabelOff = "-"

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
	case RolePrefill:
		return RolePrefill
	case RoleDecode, "prefill-decode", "both":
		return RoleDecode
	case "":
		if ok {
			bad(v)
		}
		return RoleDecode
	default:
		bad(v)
		return RoleDecode
	}
}
