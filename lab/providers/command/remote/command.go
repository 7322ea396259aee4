// Package remote serves command:remote:Command: a command run on a host reached over SSH.
package remote

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi-go-provider/infer"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"golang.org/x/crypto/ssh"

	"spark-vllm/lab/command/internal/run"
)

// Logging is command:remote:Logging.
type Logging string

func (Logging) Values() []infer.EnumValue[Logging] {
	return []infer.EnumValue[Logging]{
		{Name: "Stdout", Value: run.LogStdout, Description: "Capture stdout in logs but not stderr"},
		{Name: "Stderr", Value: run.LogStderr, Description: "Capture stderr in logs but not stdout"},
		{Name: "StdoutAndStderr", Value: run.LogStdoutAndStderr, Description: "Capture stdout and stderr in logs"},
		{Name: "None", Value: run.LogNone, Description: "Capture no logs"},
	}
}

// Command is command:remote:Command.
type Command struct{}

// CommandInputs are the inputs of command:remote:Command, with the names the 1.2.1 SDK sends.
type CommandInputs struct {
	Connection Connection `pulumi:"connection" provider:"secret"`

	Triggers *[]any  `pulumi:"triggers,optional" provider:"replaceOnChanges"`
	Create   *string `pulumi:"create,optional"`
	Update   *string `pulumi:"update,optional"`
	Delete   *string `pulumi:"delete,optional"`

	Stdin                  *string            `pulumi:"stdin,optional"`
	Logging                *Logging           `pulumi:"logging,optional"`
	Environment            *map[string]string `pulumi:"environment,optional"`
	AddPreviousOutputInEnv *bool              `pulumi:"addPreviousOutputInEnv,optional"`
}

// CommandOutputs echo the inputs and add the captured output.
type CommandOutputs struct {
	CommandInputs
	Stdout string `pulumi:"stdout"`
	Stderr string `pulumi:"stderr"`
}

func (c *Command) Annotate(a infer.Annotator) {
	a.Describe(&c, "LAB STAND-IN (spark-vllm) for pulumi-command 1.2.1: a command run on a host over SSH.")
}

func (c *CommandInputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Connection, "The parameters with which to connect to the remote host.")
	a.Describe(&c.Triggers, "Values whose change replaces the resource (delete, then create).")
	a.Describe(&c.Create, "The command to run on create.")
	a.Describe(&c.Update, "The command to run on update; if unset, create runs again.")
	a.Describe(&c.Delete, "The command to run on delete.")
	a.Describe(&c.Stdin, "Passed to the command's standard input. Never logged.")
	a.Describe(&c.Logging, "Which of stdout/stderr are streamed to the engine's log. Default stdoutAndStderr.")
	a.Describe(&c.Environment, "Environment variables set through the SSH session (sshd must AcceptEnv them). Refused names are reported as a warning and never put on the command line.")
	a.Describe(&c.AddPreviousOutputInEnv, "Set PULUMI_COMMAND_STDOUT/STDERR from the previous run for update and delete.")
	a.SetDefault(&c.AddPreviousOutputInEnv, true)
}

func (c *CommandOutputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Stdout, "The command's standard output, one trailing newline removed.")
	a.Describe(&c.Stderr, "The command's standard error, one trailing newline removed.")
}

var (
	_ infer.CustomUpdate[CommandInputs, CommandOutputs]         = (*Command)(nil)
	_ infer.CustomDelete[CommandOutputs]                        = (*Command)(nil)
	_ infer.ExplicitDependencies[CommandInputs, CommandOutputs] = (*Command)(nil)
)

// WireDependencies: see the local package; the connection is always secret (schema and SDK).
func (*Command) WireDependencies(f infer.FieldSelector, args *CommandInputs, state *CommandOutputs) {
	echo := func(out, in any) { f.OutputField(out).DependsOn(f.InputField(in).Secret()) }
	echo(&state.Connection, &args.Connection)
	echo(&state.Triggers, &args.Triggers)
	echo(&state.Create, &args.Create)
	echo(&state.Update, &args.Update)
	echo(&state.Delete, &args.Delete)
	echo(&state.Stdin, &args.Stdin)
	echo(&state.Logging, &args.Logging)
	echo(&state.Environment, &args.Environment)
	echo(&state.AddPreviousOutputInEnv, &args.AddPreviousOutputInEnv)
	f.OutputField(&state.Connection).AlwaysSecret()
	for _, out := range []any{&state.Stdout, &state.Stderr} {
		f.OutputField(out).DependsOn(
			f.InputField(&args.Create).Secret(), f.InputField(&args.Update).Secret(),
			f.InputField(&args.Stdin).Secret(), f.InputField(&args.Environment).Secret())
	}
}

func (*Command) Create(ctx context.Context, req infer.CreateRequest[CommandInputs]) (infer.CreateResponse[CommandOutputs], error) {
	state := CommandOutputs{CommandInputs: req.Inputs}
	id, err := resource.NewUniqueHex(req.Name, 8, 0)
	if err != nil {
		return infer.CreateResponse[CommandOutputs]{}, err
	}
	if req.DryRun || state.Create == nil {
		return infer.CreateResponse[CommandOutputs]{ID: id, Output: state}, nil
	}
	state.Stdout, state.Stderr, err = execute(ctx, run.OpCreate, *state.Create, &state.CommandInputs, nil)
	if err != nil {
		return infer.CreateResponse[CommandOutputs]{}, err
	}
	return infer.CreateResponse[CommandOutputs]{ID: id, Output: state}, nil
}

func (*Command) Update(ctx context.Context, req infer.UpdateRequest[CommandInputs, CommandOutputs]) (infer.UpdateResponse[CommandOutputs], error) {
	state := CommandOutputs{CommandInputs: req.Inputs, Stdout: req.State.Stdout, Stderr: req.State.Stderr}
	if req.DryRun {
		return infer.UpdateResponse[CommandOutputs]{Output: state}, nil
	}
	cmd, op := req.Inputs.Update, run.OpUpdate
	if cmd == nil {
		cmd, op = req.Inputs.Create, run.OpCreate
	}
	if cmd == nil {
		return infer.UpdateResponse[CommandOutputs]{Output: state}, nil
	}
	prev := run.PreviousOutputEnv(req.Inputs.AddPreviousOutputInEnv, req.State.Stdout, req.State.Stderr)
	stdout, stderr, err := execute(ctx, op, *cmd, &state.CommandInputs, prev)
	if err != nil {
		return infer.UpdateResponse[CommandOutputs]{}, err
	}
	state.Stdout, state.Stderr = stdout, stderr
	return infer.UpdateResponse[CommandOutputs]{Output: state}, nil
}

func (*Command) Delete(ctx context.Context, req infer.DeleteRequest[CommandOutputs]) (infer.DeleteResponse, error) {
	s := req.State
	if s.Delete == nil {
		return infer.DeleteResponse{}, nil
	}
	prev := run.PreviousOutputEnv(s.AddPreviousOutputInEnv, s.Stdout, s.Stderr)
	_, _, err := execute(ctx, run.OpDelete, *s.Delete, &s.CommandInputs, prev)
	return infer.DeleteResponse{}, err
}

// execute runs command in a new session on the host. Environment variables go through the
// SSH "env" request only; when sshd refuses some (no matching AcceptEnv) the command still
// runs without them and a warning names the refused variables (names only, never values).
func execute(ctx context.Context, op run.Op, command string, in *CommandInputs, prev map[string]string) (string, string, error) {
	client, cleanup, err := in.Connection.Dial(ctx)
	defer cleanup()
	if err != nil {
		return "", "", fmt.Errorf("%s command: %w", op, err)
	}
	session, err := client.NewSession()
	if err != nil {
		return "", "", fmt.Errorf("%s command: opening an SSH session: %w", op, err)
	}
	defer session.Close()

	env := map[string]string{}
	if in.Environment != nil {
		for k, v := range *in.Environment {
			env[k] = v
		}
	}
	for k, v := range prev {
		env[k] = v
	}
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	var refused []string
	for _, k := range names {
		if err := session.Setenv(k, env[k]); err != nil {
			refused = append(refused, k)
		}
	}
	if len(refused) > 0 {
		p.GetLogger(ctx).Warningf("the SSH server refused environment variable(s) %s (sshd AcceptEnv); "+
			"the command runs without them", strings.Join(refused, ", "))
	}

	if in.Stdin != nil && *in.Stdin != "" {
		session.Stdin = strings.NewReader(*in.Stdin)
	}
	logMode := ""
	if in.Logging != nil {
		logMode = string(*in.Logging)
	}
	capture := run.NewCapture(ctx, logMode)
	session.Stdout = capture.StdoutWriter()
	session.Stderr = capture.StderrWriter()

	done := make(chan error, 1)
	go func() { done <- session.Run(command) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = session.Signal(ssh.SIGTERM)
		_ = session.Close()
		err = ctx.Err()
	}
	capture.Flush()
	if err != nil {
		var exit *ssh.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("exit status %d", exit.ExitStatus())
		}
		return "", "", capture.Failure(op, err)
	}
	stdout, stderr := capture.Results()
	return stdout, stderr, nil
}
