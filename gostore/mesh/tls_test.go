package mesh

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/internal/testlog"
)

// testCA is a certificate authority made for one test, its files in dir.
type testCA struct {
	dir  string
	name string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	ca := &testCA{dir: dir, name: name, cert: cert, key: key, file: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// leafOptions change an issued certificate.
type leafOptions struct {
	hosts    []string // IP addresses and DNS names; default 127.0.0.1
	usages   []x509.ExtKeyUsage
	notAfter time.Time
}

// issue makes a certificate for name signed by ca and returns its
// certificate and key files.
func (ca *testCA) issue(t *testing.T, name string, o leafOptions) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if o.usages != nil {
		tmpl.ExtKeyUsage = o.usages
	}
	if !o.notAfter.IsZero() {
		tmpl.NotBefore = o.notAfter.Add(-time.Hour)
		tmpl.NotAfter = o.notAfter
	}
	hosts := o.hosts
	if hosts == nil {
		hosts = []string{"127.0.0.1"}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile = filepath.Join(ca.dir, ca.name+"-"+name+".pem")
	keyFile = filepath.Join(ca.dir, ca.name+"-"+name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", pkcs8)
	return certFile, keyFile
}

// files is a process's TLS files: a new certificate from ca, and ca as
// the CA when mutual.
func (ca *testCA) files(t *testing.T, name string, mutual bool) *TLSFiles {
	t.Helper()
	cert, key := ca.issue(t, name, leafOptions{})
	f := &TLSFiles{CertFile: cert, KeyFile: key}
	if mutual {
		f.CAFile = ca.file
	}
	return f
}

// clientCert loads a certificate and key issued by ca, for a hand-made
// TLS client.
func (ca *testCA) clientCert(t *testing.T, name string, o leafOptions) tls.Certificate {
	t.Helper()
	certFile, keyFile := ca.issue(t, name, o)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	return pair
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

func TestMutualTLSClusterOfThree(t *testing.T) {
	checkLeaks(t)
	cases := []struct {
		name   string
		secret []byte
	}{
		{"mutual TLS", nil},
		{"mutual TLS and a secret", []byte("the secret")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ca := newTestCA(t, t.TempDir(), "ca")
			var got [3]atomic.Int64
			i := 0
			ms := startCluster(t, 3, func(cfg *Config) {
				cfg.TLS = ca.files(t, fmt.Sprintf("p%d", i), true)
				cfg.Secret = c.secret
				me := i
				cfg.Handlers = map[byte]func(int, []byte){7: func(int, []byte) { got[me].Add(1) }}
				i++
			})
			// Every process sends to every other, data and control.
			for _, m := range ms {
				for to := range ms {
					if to != m.Index() {
						require.NoError(t, m.Send(to, 0, fmt.Appendf(nil, "%d->%d", m.Index(), to)))
						require.NoError(t, m.Send(to, 7, []byte("ctl")))
					}
				}
			}
			for _, m := range ms {
				frames := drainUntil(t, m, 2, 10*time.Second)
				var texts []string
				for _, f := range frames {
					texts = append(texts, string(f.Payload))
					assert.Equal(t, fmt.Sprintf("%d->%d", f.From, m.Index()), string(f.Payload))
				}
				assert.Len(t, texts, 2, "process %d", m.Index())
			}
			for i := range got {
				eventually(t, 5*time.Second, func() bool { return got[i].Load() == 2 }, fmt.Sprintf("process %d's control frames", i))
			}
		})
	}
}

// startLonely starts process 0 of two (process 1 never comes), for
// hand-made clients to knock on; it stops when the test ends.
func startLonely(t *testing.T, files *TLSFiles, log *testlog.Buffer) (*Mesh, string, *atomic.Int64) {
	t.Helper()
	addrs := freeAddrs(t, 2)
	cfg := testConfig(addrs, 0)
	cfg.TLS = files
	cfg.Logger = log.Logger()
	var handled atomic.Int64
	cfg.Handlers = map[byte]func(int, []byte){5: func(int, []byte) { handled.Add(1) }}
	s, err := validate(cfg)
	require.NoError(t, err)
	m := newMesh(s)
	require.NoError(t, m.begin())
	t.Cleanup(func() {
		m.fail(errors.New("test over"))
		<-m.finished
	})
	return m, addrs[0], &handled
}

// knock connects to addr as a process of the cluster would, through
// wrap (nil: plain text), and tries the start of a stream and some
// frames. It returns the bytes the server sent (raw: as they crossed the
// network), what the client could read of them (plain: decrypted, for a
// TLS client), and the client's address.
func knock(t *testing.T, addr string, wrap func(net.Conn) net.Conn) (raw, plain []byte, local string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	local = c.LocalAddr().String()
	rec := &recordingConn{Conn: c}
	var conn net.Conn = rec
	if wrap != nil {
		conn = wrap(rec)
	}
	// The HTTP/2 preface and an empty SETTINGS frame, then junk where
	// the stream would be: enough for any server to answer.
	_, _ = conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	_, _ = io.WriteString(conn, emptySettings)
	_, _ = conn.Write(bytes.Repeat([]byte("frame"), 100))
	plain, _ = io.ReadAll(conn)
	return rec.read.Bytes(), plain, local
}

// recordingConn keeps what it read.
type recordingConn struct {
	net.Conn
	read bytes.Buffer
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Write(b[:n])
	return n, err
}

func TestTLSServerRefusesAndLogsPeersThatCannotAuthenticate(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	other := newTestCA(t, dir, "other")
	tlsClient := func(certs ...tls.Certificate) func(net.Conn) net.Conn {
		return func(c net.Conn) net.Conn {
			cfg := &tls.Config{RootCAs: ca.pool(), ServerName: "127.0.0.1", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13}
			if len(certs) > 0 {
				// Sent whatever CAs the server asks for (as the mesh does).
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
			}
			return tls.Client(c, cfg)
		}
	}
	cases := []struct {
		name   string
		mutual bool // the server has a CA
		tls    bool // the server has TLS at all
		client func(net.Conn) net.Conn
		answer string // the bytes the server answers with ("": TLS records that end in an alert)
		reason string
	}{
		{"plain text to a TLS process", true, true, nil, tlsAlert, "it speaks plain text and this process requires TLS"},
		{"plain text to a TLS process without a CA", false, true, nil, tlsAlert, "it speaks plain text and this process requires TLS"},
		{"no client certificate", true, true, tlsClient(), "", "it presented no client certificate"},
		{"a certificate from another CA", true, true, tlsClient(other.clientCert(t, "intruder", leafOptions{})), "",
			"its certificate is not signed by this process's CA"},
		{"an expired certificate", true, true, tlsClient(ca.clientCert(t, "expired", leafOptions{notAfter: time.Now().Add(-time.Hour)})), "",
			"its certificate is not valid: x509: certificate has expired"},
		{"TLS to a plain-text process", false, false, tlsClient(), emptySettings, "it speaks TLS and this process has no TLS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var files *TLSFiles
			if c.tls {
				files = ca.files(t, "server", c.mutual)
			}
			var log testlog.Buffer
			m, addr, handled := startLonely(t, files, &log)
			raw, plain, local := knock(t, addr, c.client)
			if c.answer == "" {
				// Through TLS: the handshake (or the first read after it)
				// failed with the server's alert (encrypted in TLS 1.3),
				// nothing was decrypted.
				assert.Empty(t, plain)
				assert.NotEmpty(t, raw)
			} else {
				assert.Equal(t, []byte(c.answer), raw)
			}
			var refused []string
			eventually(t, 5*time.Second, func() bool {
				refused = log.Lines(`msg="refused a cluster connection"`)
				return len(refused) > 0
			}, "a refusal in the log")
			time.Sleep(100 * time.Millisecond) // no second line follows
			refused = log.Lines(`msg="refused a cluster connection"`)
			require.Len(t, refused, 1, "one line per refused connection:\n%s", strings.Join(refused, "\n"))
			assert.Contains(t, refused[0], "remote="+local)
			assert.Contains(t, refused[0], c.reason)
			// Nothing was delivered; process 1 is not up.
			assert.Nil(t, m.Drain())
			assert.Zero(t, handled.Load())
			assert.Zero(t, m.peers[1].framesIn.Load())
			m.mu.Lock()
			assert.False(t, m.peers[1].inUp)
			m.mu.Unlock()
		})
	}
}

func TestTLSMismatchFailsTheStartNamingThePeer(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	other := newTestCA(t, dir, "other")
	cases := []struct {
		name  string
		files func(i int) *TLSFiles
		bad   int   // the odd process out; -1: every process
		kind  error // what its Start fails with
		wants string
	}{
		{"a certificate from another CA", func(i int) *TLSFiles {
			if i == 2 {
				return other.files(t, "p2", true)
			}
			return ca.files(t, fmt.Sprintf("p%d", i), true)
		}, 2, ErrAuthentication, "failed TLS authentication: its certificate is not signed by this process's CA"},
		{"a process without TLS among TLS ones", func(i int) *TLSFiles {
			if i == 1 {
				return nil
			}
			return ca.files(t, fmt.Sprintf("p%d", i), true)
		}, 1, ErrTLSMismatch, "uses TLS (it answered with a TLS record) and this process does not: every process must be started with the same TLS settings"},
		{"a TLS process among ones without", func(i int) *TLSFiles {
			if i == 0 {
				return ca.files(t, "p0", true)
			}
			return nil
		}, 0, ErrTLSMismatch, "does not use TLS (it answered in plain text) and this process does: every process must be started with the same TLS settings"},
		{"TLS without a CA, certificates of a CA the machine does not trust", func(i int) *TLSFiles {
			return ca.files(t, fmt.Sprintf("p%d", i), false)
		}, -1, ErrAuthentication, "failed TLS authentication: its certificate is not signed by a CA this machine trusts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addrs := freeAddrs(t, 3)
			logs := make([]*testlog.Buffer, 3)
			cfgs := make([]Config, 3)
			for i := range cfgs {
				logs[i] = &testlog.Buffer{}
				cfgs[i] = testConfig(addrs, i)
				cfgs[i].StartTimeout = 3 * time.Second
				cfgs[i].TLS = c.files(i)
				cfgs[i].Logger = logs[i].Logger()
			}
			start := time.Now()
			ms, errs := startAll(cfgs)
			for i, err := range errs {
				require.Error(t, err, "process %d started", i)
				require.Nil(t, ms[i])
			}
			assert.Less(t, time.Since(start), cfgs[0].StartTimeout+2*time.Second)
			for i, err := range errs {
				t.Logf("process %d: %v", i, err)
			}
			// The dialing side names the peer and what is wrong. (Unless
			// every peer quit before it reached them: then it did not join,
			// and a refused connection says why.)
			clear := 0
			for i, err := range errs {
				if errors.Is(err, ErrTLSMismatch) || errors.Is(err, ErrAuthentication) {
					clear++
				}
				if c.bad >= 0 && i != c.bad {
					// The others name the odd one out: it failed TLS, or
					// did not join (it quit before they reached it), or a
					// process that saw it stopped with its name. A process
					// may also have lost a third one that quit over the odd
					// one before its abort could be sent: then that one's
					// error names the odd one out.
					assert.True(t, blamesWithin(err, errs, addrs, c.bad, i),
						"process %d names neither %s nor a process that does: %v", i, addrs[c.bad], err)
					continue
				}
				if errors.Is(err, ErrNotJoined) {
					assert.Contains(t, err.Error(), "was refused", "process %d", i)
					continue
				}
				assert.ErrorIs(t, err, c.kind, "process %d: %v", i, err)
				assert.Contains(t, err.Error(), c.wants, "process %d", i)
				assert.Regexp(t, `^process \d \(127\.0\.0\.1:\d+\) `, err.Error())
			}
			assert.Positive(t, clear, "no process said what is wrong: %v", errs)
			// Some server logged why it refused a connection.
			var refusals []string
			for _, l := range logs {
				refusals = append(refusals, l.Lines(`msg="refused a cluster connection"`, "remote=127.0.0.1:")...)
			}
			assert.NotEmpty(t, refusals)
		})
	}
}

// blamesWithin reports whether errs[i] names the process at addrs[bad], or
// names another process whose own error does.
func blamesWithin(err error, errs []error, addrs []string, bad, i int) bool {
	if strings.Contains(err.Error(), addrs[bad]) {
		return true
	}
	for k, other := range errs {
		if k != i && k != bad && other != nil && strings.Contains(err.Error(), addrs[k]) &&
			strings.Contains(other.Error(), addrs[bad]) {
			return true
		}
	}
	return false
}

func TestTLSFilesAreChecked(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	other := newTestCA(t, dir, "other")
	cert, key := ca.issue(t, "p", leafOptions{})
	otherCert, otherKey := other.issue(t, "q", leafOptions{})
	dnsCert, dnsKey := ca.issue(t, "dns", leafOptions{hosts: []string{"pod-0.flow"}})
	serverOnly, serverOnlyKey := ca.issue(t, "server-only", leafOptions{usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	expired, expiredKey := ca.issue(t, "expired", leafOptions{notAfter: time.Now().Add(-time.Hour)})
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate\n"), 0o600))
	unreadable := filepath.Join(dir, "unreadable.pem")
	require.NoError(t, os.WriteFile(unreadable, []byte("x"), 0o600))
	require.NoError(t, os.Chmod(unreadable, 0))
	encrypted := filepath.Join(dir, "encrypted.pem")
	require.NoError(t, os.WriteFile(encrypted, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), 0o600))

	cases := []struct {
		name  string
		files TLSFiles
		want  string
	}{
		{"certificate without key", TLSFiles{CertFile: cert}, "TLS certificate file " + cert + " is given without its key file"},
		{"key without certificate", TLSFiles{KeyFile: key}, "TLS key file " + key + " is given without its certificate file"},
		{"CA without certificate", TLSFiles{CAFile: ca.file}, "TLS CA file " + ca.file + " is given without a certificate and key"},
		{"missing certificate", TLSFiles{CertFile: missing, KeyFile: key}, "TLS certificate file " + missing + " cannot be read: no such file or directory"},
		{"missing key", TLSFiles{CertFile: cert, KeyFile: missing}, "TLS key file " + missing + " cannot be read: no such file or directory"},
		{"missing CA", TLSFiles{CertFile: cert, KeyFile: key, CAFile: missing}, "TLS CA file " + missing + " cannot be read: no such file or directory"},
		{"certificate not PEM", TLSFiles{CertFile: garbage, KeyFile: key}, "TLS certificate file " + garbage + " holds no PEM certificate"},
		{"key not PEM", TLSFiles{CertFile: cert, KeyFile: garbage}, "TLS key file " + garbage + " holds no PEM private key"},
		{"CA not PEM", TLSFiles{CertFile: cert, KeyFile: key, CAFile: garbage}, "TLS CA file " + garbage + " holds no PEM certificate"},
		{"swapped", TLSFiles{CertFile: key, KeyFile: cert}, "TLS certificate file " + key + " holds a private key, not a certificate (are the certificate and key files swapped?)"},
		{"encrypted key", TLSFiles{CertFile: cert, KeyFile: encrypted}, "TLS key file " + encrypted + " holds an encrypted private key"},
		{"key of another certificate", TLSFiles{CertFile: cert, KeyFile: otherKey}, "TLS key file " + otherKey + " does not belong to the certificate in " + cert},
		{"certificate not signed by the CA", TLSFiles{CertFile: otherCert, KeyFile: otherKey, CAFile: ca.file}, "TLS certificate file " + otherCert + " is not signed by the CA in " + ca.file},
		{"certificate for another host", TLSFiles{CertFile: dnsCert, KeyFile: dnsKey, CAFile: ca.file}, "TLS certificate file " + dnsCert + " is not valid for 127.0.0.1, the host of this process's address"},
		{"certificate for servers only", TLSFiles{CertFile: serverOnly, KeyFile: serverOnlyKey, CAFile: ca.file}, "TLS certificate file " + serverOnly + " may not be used for client authentication"},
		{"expired certificate", TLSFiles{CertFile: expired, KeyFile: expiredKey, CAFile: ca.file}, "TLS certificate file " + expired + " is not valid: x509: certificate has expired"},
	}
	if os.Geteuid() != 0 { // root reads anything
		cases = append(cases, struct {
			name  string
			files TLSFiles
			want  string
		}{"unreadable certificate", TLSFiles{CertFile: unreadable, KeyFile: key}, "TLS certificate file " + unreadable + " cannot be read: permission denied"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(freeAddrs(t, 2), 0)
			cfg.TLS = &c.files
			start := time.Now()
			m, err := Start(context.Background(), cfg)
			require.Nil(t, m)
			require.ErrorIs(t, err, ErrConfig)
			assert.Contains(t, err.Error(), c.want)
			assert.Less(t, time.Since(start), time.Second)
		})
	}
}

func TestLoadTLSMakesMutualTLSWithACA(t *testing.T) {
	ca := newTestCA(t, t.TempDir(), "ca")
	cert, key := ca.issue(t, "p", leafOptions{})
	plain, err := LoadTLS(cert, key, "")
	require.NoError(t, err)
	assert.Equal(t, tls.NoClientCert, plain.ClientAuth)
	assert.Nil(t, plain.RootCAs) // the machine's CAs
	assert.Equal(t, uint16(tls.VersionTLS13), plain.MinVersion)
	mutual, err := LoadTLS(cert, key, ca.file)
	require.NoError(t, err)
	assert.Equal(t, tls.RequireAndVerifyClientCert, mutual.ClientAuth)
	assert.NotNil(t, mutual.RootCAs)
	assert.NotNil(t, mutual.ClientCAs)
	_, err = LoadTLS("", "", "")
	assert.ErrorIs(t, err, ErrConfig)
}

func TestJudgeHeadTellsTLSFromHTTP2(t *testing.T) {
	settings := []byte{0, 0, 18, 4, 0, 0, 0, 0, 0, 0, 3}
	hello := []byte{0x16, 0x03, 0x03, 0x00, 0x7a}
	cases := []struct {
		name    string
		head    []byte
		tlsMode bool
		want    headVerdict
	}{
		{"SETTINGS, plain", settings, false, headOK},
		{"SETTINGS, four bytes, plain", settings[:4], false, headUndecided},
		{"SETTINGS, TLS", settings, true, headPlain},
		{"SETTINGS, four bytes, TLS", settings[:4], true, headPlain},
		{"ServerHello, TLS", hello, true, headOK},
		{"alert, TLS", []byte(tlsAlert), true, headOK},
		{"ServerHello, plain", hello, false, headTLS},
		{"alert, plain", []byte(tlsAlert), false, headTLS},
		{"two bytes of a record", hello[:2], false, headUndecided},
		{"0x16 then junk", []byte{0x16, 'x', 'y'}, true, headForeign},
		{"HTTP/1.1, TLS", []byte("HTTP/1.1 400"), true, headForeign},
		{"HTTP/1.1, plain", []byte("HTTP/1.1 400"), false, headForeign},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, judgeHead(c.head, c.tlsMode))
		})
	}
}
