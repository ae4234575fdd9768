package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Diff is what changed from the running configuration to a newly read
// one, as a reload applies it: the engine lists of static model groups
// (Engines, no Discovery) are applied; every other difference only takes
// effect on a restart (docs/serve.md, "Reloading router.yaml").
type Diff struct {
	// Groups are the model groups static in both configurations, by name,
	// in the new configuration's order: their engine lists are what a
	// reload applies (the lists may be equal).
	Groups []GroupPair
	// Restart names each setting that differs and only a restart applies,
	// by its YAML path in the new configuration: top-level fields
	// ("listen", "health"), "models (model groups added or removed)" when
	// the set of group names differs, the fields of a group present in
	// both except its engines ("models[0].policy"), and KV events on an
	// engine of a static group whose index is approximate
	// ("models[1].engines[0].events (...)"). Empty: the reload applies
	// everything.
	Restart []string
}

// GroupPair is one model group in both configurations: its index in the
// running configuration's Models and in the new one's.
type GroupPair struct {
	Running, Next int
}

// Compare compares running, the configuration in effect, with next, a
// validated one read since. exact names the groups that started with KV
// events (an exact index); a group not in it cannot take events until a
// restart. Both configurations are only read.
func Compare(running, next Config, exact map[string]bool) Diff {
	var d Diff
	differ := func(prefix string, a, b reflect.Value, skip string) {
		for k := range a.NumField() {
			name, _, _ := strings.Cut(a.Type().Field(k).Tag.Get("yaml"), ",")
			if name == "" || name == "-" || name == skip {
				continue
			}
			if !reflect.DeepEqual(a.Field(k).Interface(), b.Field(k).Interface()) {
				d.Restart = append(d.Restart, prefix+name)
			}
		}
	}
	differ("", reflect.ValueOf(running), reflect.ValueOf(next), "models")
	names := func(ms []Model) []string {
		out := make([]string, len(ms))
		for i, m := range ms {
			out[i] = m.Name
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(names(running.Models), names(next.Models)) {
		d.Restart = append(d.Restart, "models (model groups added or removed)")
	}
	for i, m := range next.Models {
		j := slices.IndexFunc(running.Models, func(o Model) bool { return o.Name == m.Name })
		if j < 0 {
			continue
		}
		if running.Models[j].Discovery == nil && m.Discovery == nil {
			d.Groups = append(d.Groups, GroupPair{Running: j, Next: i})
		}
		prefix := fmt.Sprintf("models[%d].", i)
		differ(prefix, reflect.ValueOf(running.Models[j]), reflect.ValueOf(m), "engines")
		if exact[m.Name] || m.Discovery != nil {
			continue
		}
		for k, e := range m.Engines {
			if e.Events != "" {
				d.Restart = append(d.Restart, fmt.Sprintf("%sengines[%d].events (the group started without KV events: its index is approximate)", prefix, k))
			}
		}
	}
	return d
}
