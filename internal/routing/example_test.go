package routing_test

import (
	"fmt"
	"math/rand/v2"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
)

// Two replicas; one was routed a long prompt before (approximate index), so
// a follow-up sharing its prefix goes there, and the lease holds its load.
func Example() {
	ix, _ := kvindex.NewApprox(kvindex.Config{Model: "m", BlockSize: 16}, nil, nil)
	r, _ := routing.New(routing.Config{Rand: rand.New(rand.NewPCG(1, 2))}, ix, nil, nil)
	r.AddReplica("http://a:8000")
	r.AddReplica("http://b:8000")

	prompt := make([]uint32, 2000)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	d, first, _ := r.Route(&routing.Request{Tokens: prompt})
	first.Release()

	d2, lease, _ := r.Route(&routing.Request{Tokens: append(prompt, 7, 7, 7)})
	defer lease.Release()
	fmt.Println(d2.Name == d.Name, d2.Chosen().CachedBlocks, "cached blocks")
	// Output: true 125 cached blocks
}
