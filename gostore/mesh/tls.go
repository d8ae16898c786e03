package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TLS between the processes of a cluster (optional).
//
// With a certificate and its key, every process serves its streams over
// TLS 1.3 with that certificate, and every process dials over TLS,
// checking the peer's certificate for the host of the peer's address (an
// IP address against the certificate's IP SANs). Without a CA file that
// check uses the machine's trusted CAs. With a CA file it uses that CA
// only, and the servers also require a client certificate signed by it
// (mutual TLS): every process presents its own certificate when it dials.
// The secret's handshake runs inside TLS as before.
//
// A process with TLS and one without cannot talk: the server tells from
// the first byte of a connection (a TLS ClientHello starts with 0x16) and
// refuses at once, logging one line, and answers in its own protocol so
// that the dialing side can say what is wrong (a TLS alert record to a
// plain-text client, an HTTP/2 SETTINGS frame to a TLS one). A TLS
// handshake that fails (a certificate not signed by the CA, no client
// certificate, a certificate for another host) is refused and logged the
// same way; the dialing side fails its Start at once naming the peer.

// TLSFiles names the PEM files that turn on TLS between the processes of
// a cluster (Config.TLS). All empty is no TLS.
type TLSFiles struct {
	CertFile string // this process's certificate, PEM; a chain starts with the leaf
	KeyFile  string // the certificate's private key, PEM (PKCS #8, PKCS #1 or SEC 1), not encrypted
	CAFile   string // optional: the CA certificates, PEM, that sign every process's certificate; turns on mutual TLS
}

// enabled reports whether any file is named.
func (f *TLSFiles) enabled() bool { return f != nil && *f != TLSFiles{} }

// Record and frame bytes the servers answer a mismatched peer with.
const (
	// tlsAlert is a TLS fatal alert record (unexpected_message): what a
	// TLS process answers a plain-text client with.
	tlsAlert = "\x15\x03\x03\x00\x02\x02\x0a"
	// emptySettings is an HTTP/2 SETTINGS frame without settings: what a
	// plain-text process answers a TLS client with.
	emptySettings = "\x00\x00\x00\x04\x00\x00\x00\x00\x00"
)

// tlsHandshakeRecord is the first byte of every TLS ClientHello.
const tlsHandshakeRecord = 0x16

// LoadTLS reads this process's certificate and key, and the CA when
// caFile is not empty, and returns the TLS configuration of a cluster
// process: TLS 1.3, the certificate presented by servers and, with a CA,
// by clients too; with a CA, client certificates required and verified
// against it (mutual TLS) and servers verified against it, else servers
// verified against the machine's trusted CAs. Every error wraps ErrConfig
// and names the file and what is wrong with it.
func LoadTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "" && caFile == "":
		return nil, errorf(ErrConfig, nil, "TLS needs a certificate file and its key file")
	case certFile == "" && keyFile == "":
		return nil, errorf(ErrConfig, nil, "TLS CA file %s is given without a certificate and key: with mutual TLS every process presents its own certificate, signed by that CA", caFile)
	case keyFile == "":
		return nil, errorf(ErrConfig, nil, "TLS certificate file %s is given without its key file", certFile)
	case certFile == "":
		return nil, errorf(ErrConfig, nil, "TLS key file %s is given without its certificate file", keyFile)
	}
	certPEM, err := readTLSFile("certificate", certFile)
	if err != nil {
		return nil, err
	}
	if _, err := parseCertificates("certificate", certFile, certPEM); err != nil {
		return nil, err
	}
	keyPEM, err := readTLSFile("key", keyFile)
	if err != nil {
		return nil, err
	}
	if err := checkKey(keyFile, keyPEM); err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, errorf(ErrConfig, err, "TLS key file %s does not belong to the certificate in %s (%v)", keyFile, certFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
	}
	if caFile == "" {
		return cfg, nil
	}
	caPEM, err := readTLSFile("CA", caFile)
	if err != nil {
		return nil, err
	}
	cas, err := parseCertificates("CA", caFile, caPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	cfg.RootCAs = pool
	cfg.ClientCAs = pool
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	// Present the certificate whatever CAs the server names as acceptable:
	// a server with another CA then sees it and says why it refuses,
	// instead of seeing no certificate at all.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	if err := checkOwnCertificate(certFile, caFile, pair, pool); err != nil {
		return nil, err
	}
	return cfg, nil
}

// readTLSFile reads one of the TLS files.
func readTLSFile(what, path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		cause := err
		var pe *fs.PathError
		if errors.As(err, &pe) {
			cause = pe.Err
		}
		return nil, errorf(ErrConfig, err, "TLS %s file %s cannot be read: %v", what, path, cause)
	}
	return data, nil
}

// parseCertificates returns the certificates of a PEM file, or an error
// saying what the file holds instead.
func parseCertificates(what, path string, data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	var other []string
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			other = append(other, block.Type)
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, errorf(ErrConfig, err, "TLS %s file %s: certificate %d cannot be parsed: %v", what, path, len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) > 0 {
		return certs, nil
	}
	for _, t := range other {
		if strings.HasSuffix(t, "PRIVATE KEY") {
			return nil, errorf(ErrConfig, nil, "TLS %s file %s holds a private key, not a certificate (are the certificate and key files swapped?)", what, path)
		}
	}
	if len(other) > 0 {
		return nil, errorf(ErrConfig, nil, "TLS %s file %s holds no certificate (only PEM blocks of type %s)", what, path, strings.Join(other, ", "))
	}
	return nil, errorf(ErrConfig, nil, "TLS %s file %s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", what, path)
}

// checkKey checks that a key file holds one private key this package can
// use, saying what it holds instead.
func checkKey(path string, data []byte) error {
	var types []string
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		types = append(types, block.Type)
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		if block.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(block.Headers["Proc-Type"], "ENCRYPTED") {
			return errorf(ErrConfig, nil, "TLS key file %s holds an encrypted private key: give it unencrypted (protect the file instead)", path)
		}
		var err error
		switch block.Type {
		case "RSA PRIVATE KEY":
			_, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			_, err = x509.ParseECPrivateKey(block.Bytes)
		default:
			_, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		}
		if err != nil {
			return errorf(ErrConfig, err, "TLS key file %s: the private key cannot be parsed: %v", path, err)
		}
		return nil
	}
	for _, t := range types {
		if t == "CERTIFICATE" {
			return errorf(ErrConfig, nil, "TLS key file %s holds a certificate, not a private key (are the certificate and key files swapped?)", path)
		}
	}
	return errorf(ErrConfig, nil, "TLS key file %s holds no PEM private key (-----BEGIN PRIVATE KEY-----)", path)
}

// checkOwnCertificate refuses a certificate the other processes would
// refuse: one the CA did not sign, one expired, or one that may not serve
// as both a server's and a client's (every process is both).
func checkOwnCertificate(certFile, caFile string, pair tls.Certificate, pool *x509.CertPool) error {
	leaf := pair.Leaf
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	for _, use := range []struct {
		eku  x509.ExtKeyUsage
		name string
	}{{x509.ExtKeyUsageServerAuth, "server"}, {x509.ExtKeyUsageClientAuth, "client"}} {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{use.eku}})
		if err == nil {
			continue
		}
		var ua x509.UnknownAuthorityError
		var ci x509.CertificateInvalidError
		switch {
		case errors.As(err, &ua):
			return errorf(ErrConfig, err, "TLS certificate file %s is not signed by the CA in %s: the other processes would refuse it", certFile, caFile)
		case errors.As(err, &ci) && ci.Reason == x509.IncompatibleUsage:
			return errorf(ErrConfig, err, "TLS certificate file %s may not be used for %s authentication: every process is both server and client, so its extended key usage must allow both (serverAuth and clientAuth) or be absent", certFile, use.name)
		default:
			return errorf(ErrConfig, err, "TLS certificate file %s is not valid: %v", certFile, err)
		}
	}
	return nil
}

// checkHost refuses a certificate that is not valid for the host of this
// process's own address: every other process checks it for that host.
func checkHost(certFile string, leaf *x509.Certificate, address string) error {
	host, _, _ := net.SplitHostPort(address)
	if err := leaf.VerifyHostname(host); err != nil {
		return errorf(ErrConfig, err, "TLS certificate file %s is not valid for %s, the host of this process's address %s: %v (the other processes check it for that host)",
			certFile, host, address, err)
	}
	return nil
}

// tlsSetup is a loaded TLS configuration of one process.
type tlsSetup struct {
	base   *tls.Config
	withCA bool
}

// server is the configuration of this process's server.
func (t *tlsSetup) server() *tls.Config { return t.base.Clone() }

// client is the configuration of a connection to the process at host.
func (t *tlsSetup) client(host string) *tls.Config {
	c := t.base.Clone()
	c.ServerName = host
	c.ClientCAs = nil
	c.ClientAuth = tls.NoClientCert
	return c
}

// serverCreds are the transport credentials of this process's server, TLS
// or not: either way a connection of the other kind is refused at its
// first byte, logged and answered in this process's own protocol.
type serverCreds struct {
	credentials.TransportCredentials                             // TLS, or insecure without
	tls                              bool                        // this process requires TLS
	refuse                           func(remote, reason string) // logs a refused connection
}

func newServerCreds(t *tlsSetup, refuse func(remote, reason string)) credentials.TransportCredentials {
	if t == nil {
		return &serverCreds{TransportCredentials: insecure.NewCredentials(), refuse: refuse}
	}
	return &serverCreds{TransportCredentials: credentials.NewTLS(t.server()), tls: true, refuse: refuse}
}

// refusedConnection logs a connection refused before any handshake of the
// cluster's own, and keeps it for Start's timeout error: the peer may not
// be heard of otherwise.
func (m *Mesh) refusedConnection(remote, reason string) {
	m.log.Warn("refused a cluster connection", "remote", remote, "reason", reason)
	if m.state.Load() == stateStarting {
		m.mu.Lock()
		m.tlsRefusal = fmt.Sprintf("a connection from %s was refused: %s", remote, reason)
		m.mu.Unlock()
	}
}

// errTLSMismatch ends a connection whose peer speaks TLS when this process
// does not, or the other way round.
var errTLSMismatch = errors.New("TLS on one side only")

// ServerHandshake looks at the first byte of a connection before handing
// it to TLS (or not): a peer of the other kind is refused at once.
func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	var first [1]byte
	if _, err := io.ReadFull(raw, first[:]); err != nil {
		return nil, nil, err // closed or silent (gRPC's deadline): nothing to say
	}
	conn := &prefixConn{Conn: raw, prefix: first[:]}
	remote := raw.RemoteAddr().String()
	isTLS := first[0] == tlsHandshakeRecord
	switch {
	case c.tls && !isTLS:
		c.refuse(remote, "it speaks plain text and this process requires TLS (every process must be started with the same TLS settings)")
		answerAndHangUp(raw, tlsAlert)
		return nil, nil, errTLSMismatch
	case !c.tls && isTLS:
		c.refuse(remote, "it speaks TLS and this process has no TLS (every process must be started with the same TLS settings)")
		answerAndHangUp(raw, emptySettings)
		return nil, nil, errTLSMismatch
	}
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil && c.tls {
		c.refuse(remote, serverTLSReason(err))
	}
	return out, info, err
}

// answerAndHangUp writes answer, then ends the sending half and reads
// what the peer still sends, briefly: a connection closed with unread
// bytes ends in a reset, which can destroy the answer before the peer
// reads it. (gRPC closes the connection afterwards.)
func answerAndHangUp(c net.Conn, answer string) {
	if _, err := io.WriteString(c, answer); err != nil {
		return
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(hangUpLinger))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// hangUpLinger is how long answerAndHangUp reads after its answer.
const hangUpLinger = 200 * time.Millisecond

// Clone returns a copy of the credentials.
func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), tls: c.tls, refuse: c.refuse}
}

// serverTLSReason says why a server's TLS handshake failed, for its log.
func serverTLSReason(err error) string {
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var oe *net.OpError
	switch {
	case errors.As(err, &ua):
		return "its certificate is not signed by this process's CA (every process's certificate must be signed by the same CA)"
	case errors.As(err, &ci):
		return "its certificate is not valid: " + ci.Error()
	case errors.As(err, &oe) && oe.Op == "remote error":
		return fmt.Sprintf("it does not accept this process's certificate (%v): it does not trust the CA that signed it", oe.Err)
	case strings.Contains(err.Error(), "didn't provide a certificate"):
		return "it presented no client certificate, and this process requires one signed by its CA (mutual TLS)"
	}
	return "its TLS handshake failed: " + err.Error()
}

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// clientCreds are the TLS credentials of one dial attempt: they note on
// the attempt's probe why the TLS handshake failed, or why the peer
// refused this process's certificate right after it (TLS 1.3 servers
// check a client's certificate after the client finished), for classify.
type clientCreds struct {
	credentials.TransportCredentials
	pr *probe
}

// ClientHandshake runs TLS on raw and watches the result.
func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		c.pr.tlsFailed(err)
		return nil, nil, err
	}
	return &alertConn{Conn: conn, pr: c.pr}, info, nil
}

// Clone returns a copy of the credentials.
func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{TransportCredentials: c.TransportCredentials.Clone(), pr: c.pr}
}

// alertConn notes a TLS alert the peer sent after the handshake.
type alertConn struct {
	net.Conn
	pr *probe
}

func (c *alertConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	var oe *net.OpError
	if err != nil && errors.As(err, &oe) && oe.Op == "remote error" {
		c.pr.tlsFailed(err)
	}
	return n, err
}

// tlsFailure turns a TLS error of a dial attempt into a permanent failure
// naming the peer, or nil when it may pass on a later attempt (the
// connection broke).
func (m *Mesh) tlsFailure(p *peer, err error) *dialFailure {
	fail := func(format string, args ...any) *dialFailure {
		args = append([]any{p.index, p.addr}, args...)
		return &dialFailure{err: errorf(ErrAuthentication, err, "process %d (%s) failed TLS authentication: "+format, args...), permanent: true}
	}
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	var oe *net.OpError
	switch {
	case errors.As(err, &ua) && m.s.tls.withCA:
		return fail("its certificate is not signed by this process's CA (every process's certificate must be signed by the same CA)")
	case errors.As(err, &ua):
		return fail("its certificate is not signed by a CA this machine trusts (give the CA file to trust its CA; that also turns on mutual TLS)")
	case errors.As(err, &he):
		return fail("its certificate is not valid for the host of its address: %v", he.Error())
	case errors.As(err, &ci):
		return fail("its certificate is not valid: %v", ci.Error())
	case errors.As(err, &oe) && oe.Op == "remote error":
		return &dialFailure{err: errorf(ErrAuthentication, err,
			"process %d (%s) refused this process's TLS certificate (%v): every process's certificate must be signed by the CA the others trust",
			p.index, p.addr, oe.Err), permanent: true}
	}
	return nil
}
