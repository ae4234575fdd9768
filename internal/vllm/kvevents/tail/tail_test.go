package tail

import (
	"bytes"
	"testing"

	"kvrouter/internal/vllm"
	"kvrouter/internal/vllm/kvevents"
)

// TestPrint: an event as a JSON line (vLLM's field names, absent fields
// null, hashes as decimal strings, one above 2^63) and as a text line;
// the totals line of each form.
func TestPrint(t *testing.T) {
	zero := 0
	parent := vllm.BlockHash(7)
	stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []vllm.BlockHash{11, 18446744073709551615}, ParentBlockHash: &parent,
		TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU", GroupIdx: &zero}
	u := kvevents.Update{Seq: 3, Rank: 1, Batch: vllm.Batch{TS: 1754530955.5, Events: []vllm.Event{stored}}}
	st := kvevents.SubscriberStats{Batches: 1, Events: 1, BlocksStored: 2}
	for _, tc := range []struct {
		json bool
		want string
	}{
		{true, `{"seq":3,"rank":1,"ts":1754530955.5,"type":"BlockStored","block_hashes":["11","18446744073709551615"],"parent_block_hash":"7","token_ids":[1,2,3,4,5,6,7,8],"block_size":4,"lora_id":null,"medium":"GPU","lora_name":null,"extra_keys":null,"group_idx":0,"kv_cache_spec_kind":null,"kv_cache_spec_sliding_window":null,"locality":null}
{"stats":{"printed":1,"batches":1,"events":1,"blocks_stored":2,"blocks_removed":0,"gaps":0,"replays":0,"replay_errors":0,"unrecoverable_gaps":0,"restarts":0,"queue_drops":0,"malformed":0,"duplicates":0,"reconnects":0}}
`},
		{false, `seq=3 rank=1 ts=1754530955.500 BlockStored hashes=11,18446744073709551615 parent=7 tokens=8 block_size=4 medium=GPU group=0
stats: printed=1 batches=1 events=1 blocks_stored=2 blocks_removed=0 gaps=0 replays=0 replay_errors=0 unrecoverable_gaps=0 restarts=0 queue_drops=0 malformed=0 duplicates=0 reconnects=0
`},
	} {
		var b bytes.Buffer
		p := eventPrinter{w: &b, json: tc.json}
		p.print(u, &u.Batch.Events[0])
		p.stats(st, 1)
		if b.String() != tc.want {
			t.Errorf("json %v:\n%s\nwant:\n%s", tc.json, b.String(), tc.want)
		}
	}
}
