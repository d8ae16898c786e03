package mesh

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// The handshake that opens every stream, before any frame:
//
//	client → server  hello:     magic, version, from, to, count, client nonce, client identity
//	server → client  challenge: server index, count, server nonce, server identity, server MAC
//	client → server  proof:     client MAC
//	server → client  accept     (or refuse, with a reason)
//
// Both MACs are HMAC-SHA256 under the cluster secret over the whole
// transcript (the hello and the challenge's body), with a different role
// label, so each side proves it knows the secret for this exchange's two
// fresh nonces: neither a recorded proof nor a reflected one passes. The
// client sends nothing but its hello before it has checked the server's
// MAC; the server delivers nothing before it has checked the client's.
// The handshake authenticates; it does not encrypt what follows.

// protocolMagic starts every hello.
const protocolMagic = "millpond-mesh"

// protocolVersion is the version of the stream protocol this package
// speaks. A peer with another version is refused with both numbers.
const protocolVersion = 1

const (
	nonceSize = 32
	macSize   = sha256.Size
	// maxIdentityEntries bounds what a peer can make this process decode.
	maxIdentityEntries = 1024
)

// hello opens a stream.
type hello struct {
	version  uint16
	from     int // the dialing process
	to       int // the process it means to reach
	count    int // the number of processes it knows
	nonce    [nonceSize]byte
	identity map[string]string
}

// challenge answers a hello.
type challenge struct {
	index    int // the answering process
	count    int
	nonce    [nonceSize]byte
	identity map[string]string
}

// refusal ends a handshake. retry says the refusal may pass later (the
// server already has a stream from that process, or is stopping).
type refusal struct {
	retry  bool
	code   refusalCode
	reason string
}

// refusalCode says what kind of refusal it is, for errors.Is.
type refusalCode byte

const (
	refusedOther refusalCode = iota
	refusedVersion
	refusedAuth
	refusedIdentity
)

// kind is the sentinel a refusal with this code wraps.
func (c refusalCode) kind() error {
	switch c {
	case refusedAuth:
		return ErrAuthentication
	case refusedIdentity:
		return ErrIdentityMismatch
	}
	return ErrRefused
}

var errNotHello = errors.New("not a millpond cluster hello")

// errVersion is returned by decodeHello for a hello of another version.
type errVersion struct{ version uint16 }

func (e errVersion) Error() string {
	return fmt.Sprintf("protocol version %d", e.version)
}

func newNonce() [nonceSize]byte {
	var n [nonceSize]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return n
}

func (h *hello) encode() []byte {
	b := make([]byte, 0, 64+identitySize(h.identity))
	b = append(b, protocolMagic...)
	b = binary.BigEndian.AppendUint16(b, h.version)
	b = binary.BigEndian.AppendUint32(b, uint32(h.from))
	b = binary.BigEndian.AppendUint32(b, uint32(h.to))
	b = binary.BigEndian.AppendUint32(b, uint32(h.count))
	b = append(b, h.nonce[:]...)
	return appendIdentity(b, h.identity)
}

func decodeHello(b []byte) (hello, error) {
	var h hello
	r := reader{b: b}
	if string(r.bytes(len(protocolMagic))) != protocolMagic {
		return h, errNotHello
	}
	h.version = r.u16()
	if r.err == nil && h.version != protocolVersion {
		return h, errVersion{h.version}
	}
	h.from = int(r.u32())
	h.to = int(r.u32())
	h.count = int(r.u32())
	copy(h.nonce[:], r.bytes(nonceSize))
	h.identity = r.identity()
	return h, r.done("hello")
}

func (c *challenge) encode() []byte {
	b := make([]byte, 0, 64+identitySize(c.identity))
	b = binary.BigEndian.AppendUint32(b, uint32(c.index))
	b = binary.BigEndian.AppendUint32(b, uint32(c.count))
	b = append(b, c.nonce[:]...)
	return appendIdentity(b, c.identity)
}

func decodeChallenge(b []byte) (challenge, error) {
	var c challenge
	r := reader{b: b}
	c.index = int(r.u32())
	c.count = int(r.u32())
	copy(c.nonce[:], r.bytes(nonceSize))
	c.identity = r.identity()
	return c, r.done("challenge")
}

func (f refusal) encode() []byte {
	flags := byte(0)
	if f.retry {
		flags = 1
	}
	return append([]byte{flags, byte(f.code)}, f.reason...)
}

func decodeRefusal(b []byte) refusal {
	if len(b) < 2 {
		return refusal{reason: "no reason given"}
	}
	return refusal{retry: b[0]&1 != 0, code: refusalCode(b[1]), reason: string(b[2:])}
}

// handshakeMAC is the MAC of one side (role "client" or "server") over the
// encoded hello and challenge body.
func handshakeMAC(secret []byte, role string, helloBytes, challengeBytes []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(protocolMagic + " " + strconv.Itoa(protocolVersion) + " " + role))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(helloBytes)))
	h.Write(n[:])
	h.Write(helloBytes)
	binary.BigEndian.PutUint64(n[:], uint64(len(challengeBytes)))
	h.Write(n[:])
	h.Write(challengeBytes)
	return h.Sum(nil)
}

// signedChallenge is a challenge's body followed by the server's MAC.
func signedChallenge(secret, helloBytes []byte, c *challenge) (body, wire []byte) {
	body = c.encode()
	wire = append(body[:len(body):len(body)], handshakeMAC(secret, "server", helloBytes, body)...)
	return body, wire
}

// splitMAC separates a signed message's body from its trailing MAC.
func splitMAC(b []byte) (body, mac []byte, err error) {
	if len(b) < macSize {
		return nil, nil, fmt.Errorf("message of %d bytes is shorter than its MAC", len(b))
	}
	return b[:len(b)-macSize], b[len(b)-macSize:], nil
}

// disagreement names the first point on which two processes differ: the
// number of processes, then Identity keys in sorted order. It returns ""
// when they agree. here and there are this process's and the peer's.
func disagreement(countHere, countThere int, here, there map[string]string) string {
	if countHere != countThere {
		return fmt.Sprintf("the number of processes: %d here, %d there", countHere, countThere)
	}
	keys := slices.Sorted(maps.Keys(here))
	for k := range there {
		if _, ok := here[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		a, inHere := here[k]
		b, inThere := there[k]
		if inHere == inThere && a == b {
			continue
		}
		return fmt.Sprintf("%s: %s here, %s there", k, showValue(a, inHere), showValue(b, inThere))
	}
	return ""
}

func showValue(v string, set bool) string {
	switch {
	case !set:
		return "unset"
	case v == "":
		return `""`
	}
	return v
}

func identitySize(id map[string]string) int {
	n := 4
	for k, v := range id {
		n += 8 + len(k) + len(v)
	}
	return n
}

// appendIdentity writes the entries in key order, so equal maps encode
// equally and the MAC covers them deterministically.
func appendIdentity(b []byte, id map[string]string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(id)))
	for _, k := range slices.Sorted(maps.Keys(id)) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(id[k])))
		b = append(b, id[k]...)
	}
	return b
}

// reader decodes big-endian fields and remembers the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("truncated: wanted %d bytes, %d left", n, len(r.b))
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) str() string {
	n := r.u32()
	if r.err == nil && int64(n) > int64(len(r.b)) {
		r.err = fmt.Errorf("truncated: a string of %d bytes, %d left", n, len(r.b))
		return ""
	}
	return string(r.bytes(int(n)))
}

func (r *reader) identity() map[string]string {
	n := r.u32()
	if r.err != nil {
		return nil
	}
	if n > maxIdentityEntries {
		r.err = fmt.Errorf("identity of %d entries (at most %d)", n, maxIdentityEntries)
		return nil
	}
	id := make(map[string]string, n)
	prev := ""
	for i := range n {
		k := r.str()
		v := r.str()
		if r.err != nil {
			return nil
		}
		if i > 0 && k <= prev {
			// appendIdentity writes keys in increasing order: one
			// encoding per identity, no key twice.
			r.err = fmt.Errorf("identity key %q out of order", k)
			return nil
		}
		id[k], prev = v, k
	}
	return id
}

func (r *reader) done(what string) error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d bytes after the end", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("malformed %s: %w", what, r.err)
	}
	return nil
}
