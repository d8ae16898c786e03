package mesh

import (
	"testing"
)

// FuzzDecodeHandshake feeds arbitrary bytes (what an unauthenticated
// client or server can send) to the handshake decoders: no panic, and
// whatever decodes re-encodes to the same bytes.
func FuzzDecodeHandshake(f *testing.F) {
	f.Add((&hello{version: protocolVersion, from: 1, count: 2, identity: map[string]string{"k": "v"}}).encode())
	f.Add((&challenge{index: 1, count: 2, identity: map[string]string{"k": "v"}}).encode())
	f.Add([]byte(protocolMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := decodeHello(b); err == nil {
			if got := h.encode(); string(got) != string(b) {
				t.Fatalf("hello re-encodes differently:\n%x\n%x", b, got)
			}
		}
		if c, err := decodeChallenge(b); err == nil {
			if got := c.encode(); string(got) != string(b) {
				t.Fatalf("challenge re-encodes differently:\n%x\n%x", b, got)
			}
		}
		_ = decodeRefusal(b)
		var m msg
		_ = m.decode(b)
	})
}
