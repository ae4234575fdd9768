// Package pd is the arithmetic of disaggregated prefill and decode (P/D):
// how many bytes of KV cache one token takes for a model's shape, how long
// moving them over a link takes, and the conditional-disaggregation rule
// that decides, per request, whether the prompt is prefilled on a prefill
// engine and its KV moved to a decode engine ("remote"), prefilled by the
// decode engine itself ("local"), or served whole, prefill and decode, by a
// prefill engine ("whole", Rule.WholeMaxQueue).
//
// Units: tokens, bytes, bytes per second, seconds. Everything here is pure
// arithmetic on values: no goroutines, no clock, no I/O, safe for
// concurrent use. The engine simulator (transfer time), the proxy (the
// decision per request) and the fleet simulator (the same decision on a
// virtual clock) share it, so the three agree.
//
// The engine contract the numbers serve is vLLM's NixlConnector
// (docs/features/nixl_connector_usage.md at vllm-project/vllm 026c83f; the
// connector's scheduler side in
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py at
// c8fac58): the decode engine pulls only the prompt tokens it does not
// already hold (get_num_new_matched_tokens counts prompt tokens minus its
// locally computed ones), so the transfer is priced on that part alone.
package pd
