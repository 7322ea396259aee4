// Package run holds what local and remote commands share: how output is captured and
// logged, the PULUMI_COMMAND_* variables, and how a failing command becomes an error.
package run

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	p "github.com/pulumi/pulumi-go-provider"
)

// Names of the variables that carry the previous create/update output into update/delete.
const (
	EnvStdout = "PULUMI_COMMAND_STDOUT"
	EnvStderr = "PULUMI_COMMAND_STDERR"
)

// Logging modes, the values of the command:local:Logging / command:remote:Logging enums.
const (
	LogStdout          = "stdout"
	LogStderr          = "stderr"
	LogStdoutAndStderr = "stdoutAndStderr"
	LogNone            = "none"
)

// Op names the lifecycle step a command runs for; it appears in error messages.
type Op string

const (
	OpCreate Op = "create"
	OpUpdate Op = "update"
	OpDelete Op = "delete"
)

// tailLines and tailBytes bound how much of a failing command's output reaches the error.
const (
	tailLines = 20
	tailBytes = 4096
)

// Capture collects a command's stdout and stderr and streams complete lines to the
// engine as ephemeral status messages, as the logging mode allows. Only the command's
// output is ever logged: never the command text, its stdin, environment or connection.
type Capture struct {
	Stdout, Stderr bytes.Buffer

	mu      sync.Mutex
	logOut  bool
	logErr  bool
	log     func(string)
	pending [2]bytes.Buffer
}

// NewCapture returns a Capture for the given logging mode ("" means the default,
// stdoutAndStderr). ctx must be a provider request context (or any context: logging is
// skipped when no logger can be derived from it).
func NewCapture(ctx context.Context, mode string) *Capture {
	c := &Capture{}
	switch mode {
	case LogStdout:
		c.logOut = true
	case LogStderr:
		c.logErr = true
	case LogNone:
	default:
		c.logOut, c.logErr = true, true
	}
	c.log = func(line string) { p.GetLogger(ctx).InfoStatus(line) }
	return c
}

// StdoutWriter and StderrWriter are safe to use from two goroutines at once.
func (c *Capture) StdoutWriter() io.Writer { return &stream{c: c, idx: 0} }
func (c *Capture) StderrWriter() io.Writer { return &stream{c: c, idx: 1} }

type stream struct {
	c   *Capture
	idx int
}

func (s *stream) Write(b []byte) (int, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.idx == 0 {
		c.Stdout.Write(b)
	} else {
		c.Stderr.Write(b)
	}
	if (s.idx == 0 && c.logOut) || (s.idx == 1 && c.logErr) {
		buf := &c.pending[s.idx]
		buf.Write(b)
		for {
			i := bytes.IndexByte(buf.Bytes(), '\n')
			if i < 0 {
				break
			}
			line := string(buf.Next(i + 1))
			c.emit(strings.TrimRight(line, "\r\n"))
		}
	}
	return len(b), nil
}

func (c *Capture) emit(line string) {
	if c.log == nil {
		return
	}
	defer func() { _ = recover() }() // a context without a provider logger: drop the line
	c.log(line)
}

// Flush logs any last partial lines.
func (c *Capture) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.pending {
		if c.pending[i].Len() > 0 {
			c.emit(strings.TrimRight(c.pending[i].String(), "\r\n"))
			c.pending[i].Reset()
		}
	}
}

// Results returns stdout and stderr with one trailing newline removed, as upstream does.
func (c *Capture) Results() (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.TrimSuffix(c.Stdout.String(), "\n"), strings.TrimSuffix(c.Stderr.String(), "\n")
}

// Failure builds the error for a command that could not run or exited non-zero. It names
// the step and carries the tail of stderr (or of stdout when stderr is empty). The command
// text is left out because it may hold secrets.
func (c *Capture) Failure(op Op, err error) error {
	stdout, stderr := c.Results()
	label, text := "stderr", stderr
	if strings.TrimSpace(stderr) == "" {
		label, text = "stdout", stdout
	}
	if strings.TrimSpace(text) == "" {
		return fmt.Errorf("%s command failed: %w (no output)", op, err)
	}
	return fmt.Errorf("%s command failed: %w; %s (last lines):\n%s", op, err, label, Tail(text))
}

// Tail returns at most the last tailLines lines and tailBytes bytes of s.
func Tail(s string) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > tailLines {
		lines = lines[len(lines)-tailLines:]
	}
	out := strings.Join(lines, "\n")
	if len(out) > tailBytes {
		out = "..." + out[len(out)-tailBytes:]
	}
	return out
}

// PreviousOutputEnv returns the PULUMI_COMMAND_STDOUT/STDERR pairs to add for update and
// delete, when addPreviousOutputInEnv is unset (default true) or true, and the previous
// output is non-empty.
func PreviousOutputEnv(add *bool, prevStdout, prevStderr string) map[string]string {
	env := map[string]string{}
	if add != nil && !*add {
		return env
	}
	if prevStdout != "" {
		env[EnvStdout] = prevStdout
	}
	if prevStderr != "" {
		env[EnvStderr] = prevStderr
	}
	return env
}
