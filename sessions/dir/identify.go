package dir

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// IdentifyTimesFile is the file, beside a process's sessions, that keeps
// the moment of the last identify written in each bucket, so that a new
// process (supervise after its parent was killed) spaces its first
// identifies from its predecessor's: the gateway counts its 5 s between
// two identifies of a bucket whoever sent them.
const IdentifyTimesFile = "identify-times.json"

// IdentifyTimes is the last identify written in each bucket (shard %
// MaxConcurrency).
type IdentifyTimes struct {
	MaxConcurrency int               `json:"max_concurrency"`
	Written        map[int]time.Time `json:"written"`
}

// Floor returns the last write that concerns shard's bucket under
// maxConcurrency: its own bucket's when the buckets are the same, else
// the latest of all (a bucket of one plan may be any of the other's).
func (t IdentifyTimes) Floor(shard, maxConcurrency int) time.Time {
	if t.MaxConcurrency == maxConcurrency && maxConcurrency > 0 {
		return t.Written[shard%maxConcurrency]
	}
	var last time.Time
	for _, w := range t.Written {
		if w.After(last) {
			last = w
		}
	}
	return last
}

// LoadIdentifyTimes reads folder's identify times; none (no file) is no
// error.
func LoadIdentifyTimes(folder string) (IdentifyTimes, error) {
	b, err := os.ReadFile(filepath.Join(folder, IdentifyTimesFile))
	if errors.Is(err, os.ErrNotExist) {
		return IdentifyTimes{}, nil
	}
	if err != nil {
		return IdentifyTimes{}, err
	}
	var t IdentifyTimes
	if err := json.Unmarshal(b, &t); err != nil {
		return IdentifyTimes{}, fmt.Errorf("%s: %w", IdentifyTimesFile, err)
	}
	return t, nil
}

// SaveIdentifyTimes writes t into folder, whole or not at all (a
// temporary file renamed over the last one).
func SaveIdentifyTimes(folder string, t IdentifyTimes) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := filepath.Join(folder, "."+IdentifyTimesFile+tmpMark+strconv.FormatUint(rand.Uint64(), 16))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(folder, IdentifyTimesFile)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
