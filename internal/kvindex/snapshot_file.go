package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/fxamacker/cbor/v2"
	"github.com/zeebo/xxh3"
)

// ErrSnapshot marks a snapshot file or Snapshot that cannot be used: not a
// snapshot, another version, truncated, failing its checksum, malformed,
// inconsistent, or taken of another key space.
var ErrSnapshot = errors.New("kvindex: unusable snapshot")

// The snapshot file (EncodeSnapshots): a 24-byte header, the payload, and
// the XXH3-64 of header and payload, all integers big-endian:
//
//	0  magic "KVRSNAP\x00"
//	8  version uint32 (SnapshotVersion)
//	12 reserved uint32, 0
//	16 payload length uint64
//	24 payload: a CBOR array of Snapshot (integer map keys, see the tags)
//	24+n checksum uint64
//
// The version changes whenever the meaning of a stored field changes,
// including the derivation of Keys (keys.go): a router never applies keys it
// would not compute itself.
const (
	SnapshotVersion = 1
	snapMagic       = "KVRSNAP\x00"
	snapHeader      = 24
)

// maxSnapshotPayload bounds a payload's claimed length (16 GiB: 2^30
// entries at about 16 bytes each in CBOR).
const maxSnapshotPayload = 1 << 34

// EncodeSnapshots writes snaps (one per model group) as one snapshot file.
func EncodeSnapshots(w io.Writer, snaps []*Snapshot) error {
	payload, err := cbor.Marshal(snaps)
	if err != nil {
		return fmt.Errorf("kvindex: encode snapshot: %w", err)
	}
	buf := make([]byte, 0, snapHeader+len(payload)+8)
	buf = append(buf, snapMagic...)
	buf = binary.BigEndian.AppendUint32(buf, SnapshotVersion)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(payload)))
	buf = append(buf, payload...)
	buf = binary.BigEndian.AppendUint64(buf, xxh3.Hash(buf))
	_, err = w.Write(buf)
	return err
}

var snapDec = func() cbor.DecMode {
	dm, err := cbor.DecOptions{
		MaxArrayElements:  1<<31 - 1,
		MaxMapPairs:       64,
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
	}.DecMode()
	if err != nil {
		panic(err) // constant options
	}
	return dm
}()

// DecodeSnapshots reads a snapshot file written by EncodeSnapshots. Any
// defect returns an error wrapping ErrSnapshot and no snapshot; the
// snapshots returned passed Snapshot's structural checks (Restore still
// checks each against its index's key space). Model names are distinct.
func DecodeSnapshots(data []byte) ([]*Snapshot, error) {
	if len(data) < snapHeader+8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than header and checksum", ErrSnapshot, len(data))
	}
	if !bytes.Equal(data[:8], []byte(snapMagic)) {
		return nil, fmt.Errorf("%w: not a kvrouter index snapshot (magic %q)", ErrSnapshot, data[:8])
	}
	if v := binary.BigEndian.Uint32(data[8:]); v != SnapshotVersion {
		return nil, fmt.Errorf("%w: version %d, this router reads version %d", ErrSnapshot, v, SnapshotVersion)
	}
	n := binary.BigEndian.Uint64(data[16:])
	if n > maxSnapshotPayload || uint64(len(data)) != snapHeader+n+8 {
		return nil, fmt.Errorf("%w: payload of %d bytes claimed, file of %d bytes (truncated?)", ErrSnapshot, n, len(data))
	}
	end := snapHeader + int(n)
	if sum := binary.BigEndian.Uint64(data[end:]); sum != xxh3.Hash(data[:end]) {
		return nil, fmt.Errorf("%w: checksum mismatch (corrupt)", ErrSnapshot)
	}
	var snaps []*Snapshot
	if err := snapDec.Unmarshal(data[snapHeader:end], &snaps); err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrSnapshot, err)
	}
	models := map[string]bool{}
	for i, s := range snaps {
		if s == nil {
			return nil, fmt.Errorf("%w: snapshot %d is null", ErrSnapshot, i)
		}
		if models[s.Model] {
			return nil, fmt.Errorf("%w: model %q twice", ErrSnapshot, s.Model)
		}
		models[s.Model] = true
		if err := s.validate(); err != nil {
			return nil, err
		}
	}
	return snaps, nil
}
