package group

import (
	"strconv"
	"strings"
)

// rankSep separates an engine's name from its data-parallel rank in a
// rank replica's name.
const rankSep = "#dp"

// RankReplica is the name of the routing replica that stands for
// data-parallel rank rank of engine: "ENGINE#dpRANK". A vLLM engine with
// data_parallel_size above 1 is routed as one replica per rank, each with its
// own index entries and load; the HTTP front and the simulator name them
// alike.
func RankReplica(engine string, rank int) string {
	return engine + rankSep + strconv.Itoa(rank)
}

// SplitRankReplica is RankReplica's inverse: for "ENGINE#dpRANK" with RANK
// a non-negative decimal it returns ENGINE, RANK and true; for any other
// name, the name, -1 and false. It does not know whether ENGINE has ranks.
func SplitRankReplica(name string) (engine string, rank int, ok bool) {
	i := strings.LastIndex(name, rankSep)
	if i < 0 {
		return name, -1, false
	}
	r, err := strconv.Atoi(name[i+len(rankSep):])
	if err != nil || r < 0 {
		return name, -1, false
	}
	return name[:i], r, true
}
