package durable

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Sealing: every commit and execution record carries a checksum of its own
// JSON. Without a key it is a SHA-256, which finds damage but not forgery:
// anyone who can write to the backup can rewrite an object, fix the
// record's checksums, and have a resume unpickle what they wrote. With a
// key (Config.Key) it is an HMAC-SHA256, which only a holder of the key can
// make. A record names each object with its SHA-256 and every object is
// checked against it before it is opened, so authenticating the records
// authenticates the objects they name too.

// AuthHMAC marks a record sealed with a key.
const AuthHMAC = "hmac-sha256"

// ErrUnauthenticated is wrapped when a key is configured and a record is
// not sealed with it (forged, or written without that key), or when a
// record sealed with a key is read without one.
var ErrUnauthenticated = errors.New("unauthenticated record")

// Key authenticates a flow's records. A nil Key seals with a plain
// SHA-256 (integrity only).
type Key []byte

// MinKeyBytes is the shortest key accepted: an HMAC key shorter than this
// is guessable.
const MinKeyBytes = 16

// Validate checks that a configured key is long enough.
func (k Key) Validate() error {
	if k != nil && len(k) < MinKeyBytes {
		return fmt.Errorf("backup key has %d bytes; use at least %d (e.g. 32 random bytes, hex or base64)", len(k), MinKeyBytes)
	}
	return nil
}

// seal points at a record's seal fields.
type seal struct{ auth, sum *string }

// digest is the record's checksum as this key makes it: the JSON of the
// record with both seal fields empty.
func (k Key) digest(v any, s *seal) (string, error) {
	auth, sum := *s.auth, *s.sum
	*s.auth, *s.sum = "", ""
	body, err := json.Marshal(v)
	*s.auth, *s.sum = auth, sum
	if err != nil {
		return "", err
	}
	if k == nil {
		d := sha256.Sum256(body)
		return hex.EncodeToString(d[:]), nil
	}
	m := hmac.New(sha256.New, k)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil)), nil
}

// seal sets the record's seal and returns its JSON.
func (k Key) seal(v any, s *seal) ([]byte, error) {
	d, err := k.digest(v, s)
	if err != nil {
		return nil, err
	}
	*s.sum = d
	*s.auth = ""
	if k != nil {
		*s.auth = AuthHMAC
	}
	return json.MarshalIndent(v, "", " ")
}

// check verifies the record's seal, naming key (the object key) in errors.
func (k Key) check(v any, s *seal, key string) error {
	switch {
	case k != nil && *s.auth != AuthHMAC:
		return fmt.Errorf("%w: %s is not authenticated by the configured backup key (MILLPOND_BACKUP_KEY): it was forged, or written without a key; refusing to read it (a flow's records must all be written with the key)",
			ErrUnauthenticated, key)
	case k == nil && *s.auth == AuthHMAC:
		return fmt.Errorf("%w: %s is sealed with a backup key, and none is configured; set MILLPOND_BACKUP_KEY (or MILLPOND_BACKUP_KEY_FILE) to the flow's key",
			ErrUnauthenticated, key)
	case k == nil && *s.auth != "":
		return fmt.Errorf("%w: %s: unknown seal %q", ErrCorrupt, key, *s.auth)
	}
	d, err := k.digest(v, s)
	if err != nil {
		return err
	}
	if !hmac.Equal([]byte(d), []byte(*s.sum)) {
		if k != nil {
			return fmt.Errorf("%w: %s does not match its HMAC under the configured backup key: it was forged or damaged, or the key is not this flow's; refusing to read it",
				ErrUnauthenticated, key)
		}
		return fmt.Errorf("%w: %s: checksum mismatch; %s", ErrCorrupt, key, dropRecordHint)
	}
	return nil
}
