package enginesim

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Data parallelism behind one endpoint, as vLLM runs it with
// --data-parallel-size N and its internal load balancer: N engine cores
// (ranks), each with its own KV cache, scheduler, metrics (label engine="r")
// and KV event sockets (port+r), share one API server. A request carrying
// the header X-data-parallel-rank (read case-insensitively; vLLM:
// vllm/entrypoints/openai/engine/serving.py _get_data_parallel_rank, a value
// that is not an integer counts as absent) goes to that rank; one outside
// 0..N-1 is refused (vLLM's input processor raises a ValueError, answered
// 400). Without the header the least loaded rank serves it: score
// waiting*4 + running, the first lowest from rank 0 (vLLM:
// vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request,
// with one API server).

// RankHeader is the request header naming the data-parallel rank.
const RankHeader = "X-Data-Parallel-Rank"

// newRanks makes ranks 1..DataParallelSize-1 beside s (rank 0), sharing its
// registry (their series differ by the engine label).
func (s *Server) newRanks(log *slog.Logger, reg prometheus.Registerer) error {
	if s.cfg.DataParallelSize <= 1 {
		return nil
	}
	s.ranks = []*Server{s}
	for r := 1; r < s.cfg.DataParallelSize; r++ {
		cfg := s.cfg
		cfg.DataParallelSize, cfg.DataParallelRank = 1, r
		rs, err := New(cfg, log.With("rank", r), reg)
		if err != nil {
			return fmt.Errorf("enginesim: data-parallel rank %d: %w", r, err)
		}
		rs.loras = s.loras // one API server: one set of adapters
		s.ranks = append(s.ranks, rs)
	}
	return nil
}

// all returns the servers of every rank, this one first.
func (s *Server) all() []*Server {
	if len(s.ranks) == 0 {
		return []*Server{s}
	}
	return s.ranks
}

// dispatch serves a generation request on the rank it names or on the
// least loaded one.
func (s *Server) dispatch(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rs, msg := s.rankFor(r.Header.Get(RankHeader))
		if msg != "" {
			writeError(w, http.StatusBadRequest, msg)
			return
		}
		rs.generate(w, r, chat)
	}
}

// rankFor picks the rank of a request whose rank header is h; msg is the
// error for a rank outside the server's.
func (s *Server) rankFor(h string) (*Server, string) {
	ranks := s.all()
	if h != "" {
		if r, err := strconv.Atoi(h); err == nil {
			if r < 0 || r >= len(ranks) {
				return nil, fmt.Sprintf("data_parallel_rank %d is out of range [0, %d)", r, len(ranks))
			}
			return ranks[r], ""
		}
	}
	best, bestScore := ranks[0], -1
	for _, rs := range ranks {
		st := rs.state.Load()
		if score := st.waiting*4 + st.running; bestScore < 0 || score < bestScore {
			best, bestScore = rs, score
		}
	}
	return best, ""
}
