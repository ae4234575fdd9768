package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Poisson gives the workload's requests, in their current order, the
// arrival times of a Poisson process at rate requests per second starting
// at zero (exponential gaps drawn from rng). It changes w in place.
func Poisson(w *Workload, rate float64, rng *rand.Rand) error {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return fmt.Errorf("poisson: rate %v must be a positive finite number", rate)
	}
	var t float64
	for i := range w.Requests {
		if i > 0 {
			t += rng.ExpFloat64() / rate
		}
		w.Requests[i].At = time.Duration(t * float64(time.Second))
	}
	if w.Params == nil {
		w.Params = map[string]string{}
	}
	w.Params["arrivals"] = "poisson"
	w.Params["rate_rps"] = fmt.Sprint(rate)
	return nil
}

// Scale divides every arrival time by speed (2 makes the workload twice as
// dense). It changes w in place.
func Scale(w *Workload, speed float64) error {
	if !(speed > 0) || math.IsInf(speed, 0) {
		return fmt.Errorf("scale: speed %v must be a positive finite number", speed)
	}
	for i := range w.Requests {
		w.Requests[i].At = time.Duration(float64(w.Requests[i].At) / speed)
	}
	return nil
}
