package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pulumi/pulumi-go-provider/infer"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// Defaults, as the 1.2.1 schema and SDK have them.
const (
	defaultUser           = "root"
	defaultPort           = 22.0
	defaultDialErrorLimit = 10
	defaultPerDialTimeout = 15
)

// Connection is command:remote:Connection.
type Connection struct {
	Host               string           `pulumi:"host"`
	Port               *float64         `pulumi:"port,optional"`
	User               *string          `pulumi:"user,optional"`
	Password           *string          `pulumi:"password,optional" provider:"secret"`
	PrivateKey         *string          `pulumi:"privateKey,optional" provider:"secret"`
	PrivateKeyPassword *string          `pulumi:"privateKeyPassword,optional" provider:"secret"`
	AgentSocketPath    *string          `pulumi:"agentSocketPath,optional"`
	DialErrorLimit     *int             `pulumi:"dialErrorLimit,optional"`
	PerDialTimeout     *int             `pulumi:"perDialTimeout,optional"`
	HostKey            *string          `pulumi:"hostKey,optional"`
	Proxy              *ProxyConnection `pulumi:"proxy,optional"`
}

// ProxyConnection is command:remote:ProxyConnection, the bastion host.
type ProxyConnection struct {
	Host               string   `pulumi:"host"`
	Port               *float64 `pulumi:"port,optional"`
	User               *string  `pulumi:"user,optional"`
	Password           *string  `pulumi:"password,optional" provider:"secret"`
	PrivateKey         *string  `pulumi:"privateKey,optional" provider:"secret"`
	PrivateKeyPassword *string  `pulumi:"privateKeyPassword,optional" provider:"secret"`
	AgentSocketPath    *string  `pulumi:"agentSocketPath,optional"`
	DialErrorLimit     *int     `pulumi:"dialErrorLimit,optional"`
	PerDialTimeout     *int     `pulumi:"perDialTimeout,optional"`
	HostKey            *string  `pulumi:"hostKey,optional"`
}

func (c *Connection) Annotate(a infer.Annotator) {
	a.Describe(&c, "How to reach the remote host over SSH.")
	a.Describe(&c.Host, "The address of the host.")
	a.Describe(&c.Port, "The SSH port.")
	a.SetDefault(&c.Port, defaultPort)
	a.Describe(&c.User, "The login user.")
	a.SetDefault(&c.User, defaultUser)
	a.Describe(&c.Password, "Password (also used for keyboard-interactive).")
	a.Describe(&c.PrivateKey, "The contents of an SSH private key.")
	a.Describe(&c.PrivateKeyPassword, "The passphrase of an encrypted private key.")
	a.Describe(&c.AgentSocketPath, "SSH agent socket; defaults to SSH_AUTH_SOCK when set.")
	a.Describe(&c.DialErrorLimit, "Dial attempts that may fail before giving up; -1 is unlimited.")
	a.SetDefault(&c.DialErrorLimit, defaultDialErrorLimit)
	a.Describe(&c.PerDialTimeout, "Seconds for each dial attempt; 0 is no limit.")
	a.SetDefault(&c.PerDialTimeout, defaultPerDialTimeout)
	a.Describe(&c.HostKey, "The host's public key in authorized_keys form. When set, the server must present exactly this key; when unset the host key is not verified.")
	a.Describe(&c.Proxy, "A bastion host to connect through.")
}

func (c *ProxyConnection) Annotate(a infer.Annotator) {
	a.Describe(&c, "How to reach the bastion host over SSH.")
	a.Describe(&c.Host, "The address of the bastion.")
	a.Describe(&c.Port, "The SSH port.")
	a.SetDefault(&c.Port, defaultPort)
	a.Describe(&c.User, "The login user.")
	a.SetDefault(&c.User, defaultUser)
	a.Describe(&c.Password, "Password (also used for keyboard-interactive).")
	a.Describe(&c.PrivateKey, "The contents of an SSH private key.")
	a.Describe(&c.PrivateKeyPassword, "The passphrase of an encrypted private key.")
	a.Describe(&c.AgentSocketPath, "SSH agent socket; defaults to SSH_AUTH_SOCK when set.")
	a.Describe(&c.DialErrorLimit, "Dial attempts that may fail before giving up; -1 is unlimited.")
	a.SetDefault(&c.DialErrorLimit, defaultDialErrorLimit)
	a.Describe(&c.PerDialTimeout, "Seconds for each dial attempt; 0 is no limit.")
	a.SetDefault(&c.PerDialTimeout, defaultPerDialTimeout)
	a.Describe(&c.HostKey, "The bastion's public key in authorized_keys form; unset means not verified.")
}

// endpoint is what dialing needs from either a Connection or a ProxyConnection.
type endpoint struct {
	host               string
	port               float64
	user               string
	password           *string
	privateKey         *string
	privateKeyPassword *string
	agentSocketPath    *string
	dialErrorLimit     int
	perDialTimeout     int
	hostKey            *string
}

func (c *Connection) endpoint() endpoint {
	return newEndpoint(c.Host, c.Port, c.User, c.Password, c.PrivateKey, c.PrivateKeyPassword,
		c.AgentSocketPath, c.DialErrorLimit, c.PerDialTimeout, c.HostKey)
}

func (c *ProxyConnection) endpoint() endpoint {
	return newEndpoint(c.Host, c.Port, c.User, c.Password, c.PrivateKey, c.PrivateKeyPassword,
		c.AgentSocketPath, c.DialErrorLimit, c.PerDialTimeout, c.HostKey)
}

func newEndpoint(host string, port *float64, user, password, key, keyPass, agentSock *string,
	dialLimit, perDial *int, hostKey *string) endpoint {
	e := endpoint{host: host, port: defaultPort, user: defaultUser, password: password,
		privateKey: key, privateKeyPassword: keyPass, agentSocketPath: agentSock,
		dialErrorLimit: defaultDialErrorLimit, perDialTimeout: defaultPerDialTimeout, hostKey: hostKey}
	if port != nil {
		e.port = *port
	}
	if user != nil {
		e.user = *user
	}
	if dialLimit != nil {
		e.dialErrorLimit = *dialLimit
	}
	if perDial != nil {
		e.perDialTimeout = *perDial
	}
	return e
}

func (e endpoint) address() string {
	return net.JoinHostPort(e.host, strconv.FormatFloat(e.port, 'f', 0, 64))
}

// HostKeyMismatchError is returned when a pinned hostKey does not match the server's key.
type HostKeyMismatchError struct {
	Address        string
	Want, Got      string // SHA256 fingerprints
	WantType, Type string
}

func (e *HostKeyMismatchError) Error() string {
	return fmt.Sprintf("ssh: host key mismatch for %s: the pinned hostKey is %s %s but the server presented %s %s",
		e.Address, e.WantType, e.Want, e.Type, e.Got)
}

func fingerprint(k ssh.PublicKey) string {
	sum := sha256.Sum256(k.Marshal())
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// hostKeyAlgorithms returns the algorithms that make a server present a key of the pinned
// key's type, so a host with several host keys is checked against the one that is pinned.
func hostKeyAlgorithms(k ssh.PublicKey) []string {
	switch k.Type() {
	case ssh.KeyAlgoRSA:
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	default:
		return []string{k.Type()}
	}
}

// clientConfig builds the SSH client configuration. It returns a closer for the agent
// connection, if one was opened.
func (e endpoint) clientConfig() (*ssh.ClientConfig, func(), error) {
	closer := func() {}
	cfg := &ssh.ClientConfig{User: e.user, HostKeyCallback: ssh.InsecureIgnoreHostKey()}
	if e.perDialTimeout > 0 {
		cfg.Timeout = time.Duration(e.perDialTimeout) * time.Second
	}
	if e.hostKey != nil && strings.TrimSpace(*e.hostKey) != "" {
		pinned, _, _, _, err := ssh.ParseAuthorizedKey([]byte(strings.TrimSpace(*e.hostKey)))
		if err != nil {
			return nil, closer, fmt.Errorf("connection.hostKey is not a public key in authorized_keys form: %w", err)
		}
		cfg.HostKeyAlgorithms = hostKeyAlgorithms(pinned)
		cfg.HostKeyCallback = func(_ string, _ net.Addr, got ssh.PublicKey) error {
			if bytes.Equal(got.Marshal(), pinned.Marshal()) {
				return nil
			}
			return &HostKeyMismatchError{Address: e.address(), Want: fingerprint(pinned),
				WantType: pinned.Type(), Got: fingerprint(got), Type: got.Type()}
		}
	}
	if e.privateKey != nil {
		var signer ssh.Signer
		var err error
		if e.privateKeyPassword != nil {
			signer, err = ssh.ParsePrivateKeyWithPassphrase([]byte(*e.privateKey), []byte(*e.privateKeyPassword))
		} else {
			signer, err = ssh.ParsePrivateKey([]byte(*e.privateKey))
		}
		if err != nil {
			// The parser's error never contains key material.
			return nil, closer, fmt.Errorf("connection.privateKey could not be parsed: %w", err)
		}
		cfg.Auth = append(cfg.Auth, ssh.PublicKeys(signer))
	}
	if e.password != nil {
		pw := *e.password
		cfg.Auth = append(cfg.Auth, ssh.Password(pw),
			ssh.KeyboardInteractive(func(_, _ string, questions []string, _ []bool) ([]string, error) {
				answers := make([]string, len(questions))
				for i := range answers {
					answers[i] = pw
				}
				return answers, nil
			}))
	}
	sock := ""
	if e.agentSocketPath != nil {
		sock = *e.agentSocketPath
	} else {
		sock = os.Getenv("SSH_AUTH_SOCK")
	}
	if sock != "" {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			if e.agentSocketPath != nil {
				return nil, closer, fmt.Errorf("connecting to the SSH agent at connection.agentSocketPath: %w", err)
			}
		} else {
			closer = func() { _ = conn.Close() }
			cfg.Auth = append(cfg.Auth, ssh.PublicKeysCallback(agent.NewClient(conn).Signers))
		}
	}
	return cfg, closer, nil
}

// permanent reports errors that another dial cannot fix.
func permanent(err error) bool {
	var mismatch *HostKeyMismatchError
	return errors.As(err, &mismatch)
}

// retry dials with backoff until it succeeds, the error is permanent, or dialErrorLimit
// failed attempts have been made (-1: no limit).
func retry[T any](ctx context.Context, limit int, what string, dial func() (T, error)) (T, error) {
	delay := 500 * time.Millisecond
	for failures := 1; ; failures++ {
		v, err := dial()
		if err == nil {
			return v, nil
		}
		if permanent(err) || (limit >= 0 && failures >= limit) || ctx.Err() != nil {
			var zero T
			return zero, fmt.Errorf("%s (after %d attempt(s)): %w", what, failures, err)
		}
		select {
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(delay):
		}
		if delay *= 2; delay > 5*time.Second {
			delay = 5 * time.Second
		}
	}
}

// Dial connects to the host, through the proxy when one is set. The returned cleanup
// closes the client, any proxy client and agent connections.
func (c *Connection) Dial(ctx context.Context) (*ssh.Client, func(), error) {
	target := c.endpoint()
	cfg, closeAgent, err := target.clientConfig()
	if err != nil {
		return nil, closeAgent, err
	}
	if c.Proxy == nil {
		client, err := retry(ctx, target.dialErrorLimit, "dialing "+target.address(), func() (*ssh.Client, error) {
			return ssh.Dial("tcp", target.address(), cfg)
		})
		if err != nil {
			return nil, closeAgent, err
		}
		return client, func() { _ = client.Close(); closeAgent() }, nil
	}

	bastion := c.Proxy.endpoint()
	pcfg, closeProxyAgent, err := bastion.clientConfig()
	if err != nil {
		closeAgent()
		return nil, closeProxyAgent, err
	}
	cleanupAgents := func() { closeAgent(); closeProxyAgent() }
	proxyClient, err := retry(ctx, bastion.dialErrorLimit, "dialing proxy "+bastion.address(), func() (*ssh.Client, error) {
		return ssh.Dial("tcp", bastion.address(), pcfg)
	})
	if err != nil {
		return nil, cleanupAgents, err
	}
	client, err := retry(ctx, target.dialErrorLimit, "dialing "+target.address()+" through the proxy", func() (*ssh.Client, error) {
		conn, err := proxyClient.Dial("tcp", target.address())
		if err != nil {
			return nil, err
		}
		cc, chans, reqs, err := ssh.NewClientConn(conn, target.address(), cfg)
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		return ssh.NewClient(cc, chans, reqs), nil
	})
	if err != nil {
		_ = proxyClient.Close()
		return nil, cleanupAgents, err
	}
	return client, func() { _ = client.Close(); _ = proxyClient.Close(); cleanupAgents() }, nil
}
