package kvindex

import (
	"bytes"
	"encoding/json"
	"strconv"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func parseU64(n json.Number) (uint64, error) { return strconv.ParseUint(string(n), 10, 64) }
