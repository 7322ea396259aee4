package run

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestLoggingModes(t *testing.T) {
	for mode, want := range map[string][]string{
		"":                 {"o1", "e1", "o2-partial", "e2-partial"},
		LogStdoutAndStderr: {"o1", "e1", "o2-partial", "e2-partial"},
		LogStdout:          {"o1", "o2-partial"},
		LogStderr:          {"e1", "e2-partial"},
		LogNone:            nil,
	} {
		c := NewCapture(context.Background(), mode)
		var got []string
		c.log = func(s string) { got = append(got, s) }
		fmt.Fprint(c.StdoutWriter(), "o1\no2-")
		fmt.Fprint(c.StderrWriter(), "e1\r\ne2-")
		fmt.Fprint(c.StdoutWriter(), "partial")
		fmt.Fprint(c.StderrWriter(), "partial")
		c.Flush()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("mode %q logged %q, want %q", mode, got, want)
		}
		out, errOut := c.Results()
		if out != "o1\no2-partial" || errOut != "e1\r\ne2-partial" {
			t.Errorf("mode %q captured %q / %q: capture must not depend on logging", mode, out, errOut)
		}
	}
}

func TestResultsTrimOneNewline(t *testing.T) {
	c := NewCapture(context.Background(), LogNone)
	fmt.Fprint(c.StdoutWriter(), "a\n\n")
	if out, _ := c.Results(); out != "a\n" {
		t.Errorf("got %q", out)
	}
}

func TestFailureUsesStdoutWhenStderrEmpty(t *testing.T) {
	c := NewCapture(context.Background(), LogNone)
	fmt.Fprint(c.StdoutWriter(), "only stdout\n")
	msg := c.Failure(OpDelete, errors.New("exit status 1")).Error()
	if !strings.Contains(msg, "delete command failed: exit status 1; stdout") || !strings.Contains(msg, "only stdout") {
		t.Errorf("got %q", msg)
	}
}

func TestPreviousOutputEnv(t *testing.T) {
	f := false
	if env := PreviousOutputEnv(&f, "o", "e"); len(env) != 0 {
		t.Errorf("addPreviousOutputInEnv=false must add nothing: %v", env)
	}
	if env := PreviousOutputEnv(nil, "o", ""); !reflect.DeepEqual(env, map[string]string{EnvStdout: "o"}) {
		t.Errorf("default true, empty values skipped: %v", env)
	}
}
