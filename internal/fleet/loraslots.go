package fleet

import "slices"

// FreeLoRASlots returns how many more LoRA adapters the endpoint's batch
// could hold at its last scrape: vllm:lora_requests_info's max_lora
// (--max-loras) minus the distinct adapters of its running and waiting
// requests (vllm/v1/metrics/loggers.py). vLLM's scheduler schedules a
// request for an adapter not in the batch only while fewer than max_loras
// adapters are in it (vllm/v1/core/sched/scheduler.py), so on an engine
// with no free slot a new adapter's requests wait. ok is false while no
// scrape reported the series (LoRA off, or not scraped yet).
func (e *Endpoint) FreeLoRASlots() (free int, ok bool) {
	li := e.lora.Load()
	if li == nil {
		return 0, false
	}
	active := slices.Concat(li.Running, li.Waiting)
	slices.Sort(active)
	return max(li.MaxLoRA-len(slices.Compact(active)), 0), true
}
