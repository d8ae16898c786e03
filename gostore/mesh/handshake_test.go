package mesh

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandshakeMessagesRoundTrip(t *testing.T) {
	h := hello{version: protocolVersion, from: 3, to: 1, count: 4, nonce: newNonce(),
		identity: map[string]string{"flow": "wordcount", "workers_per_process": "2", "": "empty key"}}
	got, err := decodeHello(h.encode())
	require.NoError(t, err)
	assert.Equal(t, h, got)

	c := challenge{index: 1, count: 4, nonce: newNonce(), identity: map[string]string{}}
	gotC, err := decodeChallenge(c.encode())
	require.NoError(t, err)
	assert.Equal(t, c, gotC)

	r := refusal{retry: true, code: refusedIdentity, reason: "why"}
	assert.Equal(t, r, decodeRefusal(r.encode()))
}

func TestDecodeHelloRejects(t *testing.T) {
	good := (&hello{version: protocolVersion, count: 2, identity: map[string]string{"a": "b"}}).encode()
	other := (&hello{version: 7, count: 2}).encode()
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "not a millpond cluster hello"},
		{"another magic", append([]byte("PRI * HTTP/2.0"), good[len(protocolMagic):]...), "not a millpond cluster hello"},
		{"another version", other, "protocol version 7"},
		{"truncated", good[:len(good)-1], "malformed hello: truncated"},
		{"trailing bytes", append(bytes.Clone(good), 0), "malformed hello: 1 bytes after the end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeHello(c.b)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestHandshakeMACBindsSecretRoleAndTranscript(t *testing.T) {
	base := handshakeMAC([]byte("s"), "server", []byte("hello"), []byte("challenge"))
	assert.Len(t, base, macSize)
	assert.Equal(t, base, handshakeMAC([]byte("s"), "server", []byte("hello"), []byte("challenge")))
	for name, other := range map[string][]byte{
		"secret":     handshakeMAC([]byte("t"), "server", []byte("hello"), []byte("challenge")),
		"role":       handshakeMAC([]byte("s"), "client", []byte("hello"), []byte("challenge")),
		"hello":      handshakeMAC([]byte("s"), "server", []byte("hellO"), []byte("challenge")),
		"challenge":  handshakeMAC([]byte("s"), "server", []byte("hello"), []byte("challengE")),
		"boundaries": handshakeMAC([]byte("s"), "server", []byte("hellochal"), []byte("lenge")),
	} {
		assert.NotEqual(t, base, other, name)
	}
}

func TestDisagreement(t *testing.T) {
	cases := []struct {
		name        string
		n1, n2      int
		here, there map[string]string
		want        string
	}{
		{"agree", 2, 2, map[string]string{"a": "1"}, map[string]string{"a": "1"}, ""},
		{"both empty", 2, 2, nil, map[string]string{}, ""},
		{"count first", 2, 3, map[string]string{"a": "1"}, map[string]string{"a": "2"}, "the number of processes: 2 here, 3 there"},
		{"first key in order", 2, 2, map[string]string{"b": "1", "c": "1"}, map[string]string{"b": "2", "c": "2"}, "b: 1 here, 2 there"},
		{"missing there", 2, 2, map[string]string{"a": "1"}, nil, "a: 1 here, unset there"},
		{"missing here", 2, 2, nil, map[string]string{"z": "9"}, "z: unset here, 9 there"},
		{"empty value", 2, 2, map[string]string{"a": ""}, map[string]string{"a": "x"}, `a: "" here, x there`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, disagreement(c.n1, c.n2, c.here, c.there))
		})
	}
}

func TestCodecKeepsKindAndPayload(t *testing.T) {
	for _, m := range []msg{
		{typ: msgFrame, kind: 0, body: []byte("data")},
		{typ: msgFrame, kind: 255, body: nil},
		{typ: msgHeartbeat},
		{typ: msgAbort, body: []byte("why")},
	} {
		bs, err := rawCodec{}.Marshal(&m)
		require.NoError(t, err)
		var got msg
		require.NoError(t, rawCodec{}.Unmarshal(bs, &got))
		assert.Equal(t, m.typ, got.typ)
		assert.Equal(t, m.kind, got.kind)
		assert.Equal(t, string(m.body), string(got.body))
	}
	var got msg
	assert.Error(t, got.decode(nil))
	assert.Error(t, got.decode([]byte{byte(msgFrame)}))
	_, err := rawCodec{}.Marshal("not a message")
	assert.Error(t, err)
}

func TestSniffingTellsHTTP2FromOtherProtocols(t *testing.T) {
	cases := []struct {
		name    string
		first   []byte
		foreign bool
	}{
		{"HTTP/2 SETTINGS", []byte{0, 0, 18, 4, 0, 0, 0, 0, 0, 0, 3}, false},
		{"HTTP/2 SETTINGS, first byte only", []byte{0}, false},
		{"HTTP/1.1", []byte("HTTP/1.1 400 Bad Request\r\n"), true},
		{"SETTINGS ACK first", []byte{0, 0, 0, 4, 1, 0, 0, 0, 0}, true},
		{"DATA frame first", []byte{0, 0, 4, 0, 0, 0, 0, 0, 1}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			called := false
			pr := &probe{onForeign: func() { called = true }}
			pr.dialed(nil)
			// Byte by byte, as a slow network would deliver them.
			for i := range c.first {
				pr.observe(c.first[i:i+1], nil)
			}
			assert.Equal(t, c.foreign, pr.foreign)
			assert.Equal(t, c.foreign, called)
		})
	}
}

func TestIdentityEncodingIsCanonical(t *testing.T) {
	enc := func(keys ...string) []byte {
		b := appendIdentity(nil, nil)[:0]
		b = append(b, 0, 0, 0, byte(len(keys)))
		for _, k := range keys {
			b = append(b, 0, 0, 0, byte(len(k)))
			b = append(b, k...)
			b = append(b, 0, 0, 0, 0)
		}
		return b
	}
	r := reader{b: enc("a", "b")}
	assert.Equal(t, map[string]string{"a": "", "b": ""}, r.identity())
	require.NoError(t, r.err)
	for _, keys := range [][]string{{"b", "a"}, {"a", "a"}} {
		r := reader{b: enc(keys...)}
		r.identity()
		assert.ErrorContains(t, r.err, "out of order", "%v", keys)
	}
}
