package sim

import (
	"fmt"
	"hash/fnv"

	"kvrouter/internal/workload"
)

// servesAdapter reports whether replica i has adapter a loaded (see
// Config.AdapterReplicas).
func (f *fleet) servesAdapter(i int, a string) bool {
	if a == "" || f.cfg.AdapterReplicas == 0 {
		return true
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(a))
	return (i+int(h.Sum32()%uint32(f.cfg.Replicas)))%f.cfg.Replicas < f.cfg.AdapterReplicas
}

// lacking returns the names of the replicas without adapter a (nil when
// every replica serves it), for routing.Request.Exclude.
func (f *fleet) lacking(a string) []string {
	if a == "" || f.cfg.AdapterReplicas == 0 {
		return nil
	}
	var out []string
	for i, r := range f.reps {
		if !f.servesAdapter(i, a) {
			out = append(out, r.name)
		}
	}
	return out
}

// assignAdapters gives every second session of w one of n LoRA adapters
// ("lora-0" ...), by a hash of the session: a group's requests share their
// adapter, and with it their prefix.
func assignAdapters(w *workload.Workload, n int) {
	for i := range w.Requests {
		r := &w.Requests[i]
		h := fnv.New32a()
		_, _ = h.Write([]byte(r.Session))
		if v := h.Sum32(); v%2 == 1 {
			r.LoRA = fmt.Sprintf("lora-%d", v/2%uint32(n))
		}
	}
	w.Params["adapters"] = fmt.Sprint(n)
}
