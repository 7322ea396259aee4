// Package local serves command:local:Command: a shell command run on the machine where
// the Pulumi engine runs the provider.
package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi-go-provider/infer"
	"github.com/pulumi/pulumi-go-provider/infer/types"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"

	"spark-vllm/lab/command/internal/run"
)

// Logging is command:local:Logging.
type Logging string

func (Logging) Values() []infer.EnumValue[Logging] {
	return []infer.EnumValue[Logging]{
		{Name: "Stdout", Value: run.LogStdout, Description: "Capture stdout in logs but not stderr"},
		{Name: "Stderr", Value: run.LogStderr, Description: "Capture stderr in logs but not stdout"},
		{Name: "StdoutAndStderr", Value: run.LogStdoutAndStderr, Description: "Capture stdout and stderr in logs"},
		{Name: "None", Value: run.LogNone, Description: "Capture no logs"},
	}
}

// Command is command:local:Command.
type Command struct{}

// CommandInputs are the inputs of command:local:Command, with the names the 1.2.1 SDK sends.
type CommandInputs struct {
	Triggers *[]any  `pulumi:"triggers,optional" provider:"replaceOnChanges"`
	Create   *string `pulumi:"create,optional"`
	Update   *string `pulumi:"update,optional"`
	Delete   *string `pulumi:"delete,optional"`

	Stdin                  *string            `pulumi:"stdin,optional"`
	Logging                *Logging           `pulumi:"logging,optional"`
	Environment            *map[string]string `pulumi:"environment,optional"`
	AddPreviousOutputInEnv *bool              `pulumi:"addPreviousOutputInEnv,optional"`
	Dir                    *string            `pulumi:"dir,optional"`
	Interpreter            *[]string          `pulumi:"interpreter,optional"`
	AssetPaths             *[]string          `pulumi:"assetPaths,optional"`
	ArchivePaths           *[]string          `pulumi:"archivePaths,optional"`
}

// CommandOutputs echo the inputs and add the captured output.
type CommandOutputs struct {
	CommandInputs
	Stdout  string                           `pulumi:"stdout"`
	Stderr  string                           `pulumi:"stderr"`
	Assets  *map[string]types.AssetOrArchive `pulumi:"assets,optional"`
	Archive *types.AssetOrArchive            `pulumi:"archive,optional"`
}

func (c *Command) Annotate(a infer.Annotator) {
	a.Describe(&c, "LAB STAND-IN (spark-vllm) for pulumi-command 1.2.1: a command run locally.")
}

func (c *CommandInputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Triggers, "Values whose change replaces the resource (delete, then create).")
	a.Describe(&c.Create, "The command to run on create.")
	a.Describe(&c.Update, "The command to run on update; if unset, create runs again.")
	a.Describe(&c.Delete, "The command to run on delete.")
	a.Describe(&c.Stdin, "Passed to the command's standard input. Never logged.")
	a.Describe(&c.Logging, "Which of stdout/stderr are streamed to the engine's log. Default stdoutAndStderr.")
	a.Describe(&c.Environment, "Additional environment variables for the command's process.")
	a.Describe(&c.AddPreviousOutputInEnv, "Set PULUMI_COMMAND_STDOUT/STDERR from the previous run for update and delete.")
	a.SetDefault(&c.AddPreviousOutputInEnv, true)
	a.Describe(&c.Dir, "Working directory; defaults to the provider's current directory.")
	a.Describe(&c.Interpreter, "The program and arguments the command is appended to; default [\"/bin/sh\", \"-c\"].")
	a.Describe(&c.AssetPaths, "Not supported by the lab stand-in (accepted in the schema, refused at check).")
	a.Describe(&c.ArchivePaths, "Not supported by the lab stand-in (accepted in the schema, refused at check).")
}

func (c *CommandOutputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Stdout, "The command's standard output, one trailing newline removed.")
	a.Describe(&c.Stderr, "The command's standard error, one trailing newline removed.")
	a.Describe(&c.Assets, "Not produced by the lab stand-in.")
	a.Describe(&c.Archive, "Not produced by the lab stand-in.")
}

var (
	_ infer.CustomCheck[CommandInputs]                          = (*Command)(nil)
	_ infer.CustomUpdate[CommandInputs, CommandOutputs]         = (*Command)(nil)
	_ infer.CustomDelete[CommandOutputs]                        = (*Command)(nil)
	_ infer.ExplicitDependencies[CommandInputs, CommandOutputs] = (*Command)(nil)
)

// Check applies defaults and refuses the inputs this stand-in does not implement.
func (*Command) Check(ctx context.Context, req infer.CheckRequest) (infer.CheckResponse[CommandInputs], error) {
	in, failures, err := infer.DefaultCheck[CommandInputs](ctx, req.NewInputs)
	if err != nil || len(failures) > 0 {
		return infer.CheckResponse[CommandInputs]{Inputs: in, Failures: failures}, err
	}
	if in.AssetPaths != nil {
		failures = append(failures, p.CheckFailure{Property: "assetPaths",
			Reason: "assetPaths is not implemented by the spark-vllm lab stand-in command provider"})
	}
	if in.ArchivePaths != nil {
		failures = append(failures, p.CheckFailure{Property: "archivePaths",
			Reason: "archivePaths is not implemented by the spark-vllm lab stand-in command provider"})
	}
	return infer.CheckResponse[CommandInputs]{Inputs: in, Failures: failures}, nil
}

// WireDependencies: each echoed input keeps its own secretness; stdout/stderr become
// secret when a command, stdin or environment is secret (stricter than upstream, which
// only follows create/update). Computedness keeps the default: any changed input makes
// stdout/stderr unknown in a preview.
func (*Command) WireDependencies(f infer.FieldSelector, args *CommandInputs, state *CommandOutputs) {
	echo := func(out, in any) { f.OutputField(out).DependsOn(f.InputField(in).Secret()) }
	echo(&state.Triggers, &args.Triggers)
	echo(&state.Create, &args.Create)
	echo(&state.Update, &args.Update)
	echo(&state.Delete, &args.Delete)
	echo(&state.Stdin, &args.Stdin)
	echo(&state.Logging, &args.Logging)
	echo(&state.Environment, &args.Environment)
	echo(&state.AddPreviousOutputInEnv, &args.AddPreviousOutputInEnv)
	echo(&state.Dir, &args.Dir)
	echo(&state.Interpreter, &args.Interpreter)
	echo(&state.AssetPaths, &args.AssetPaths)
	echo(&state.ArchivePaths, &args.ArchivePaths)
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
	// As upstream: a failed create is not recorded, so the next up creates again.
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
	cmd := req.Inputs.Update
	op := run.OpUpdate
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

// execute runs command through the interpreter with the process environment plus
// `environment` plus prev (the PULUMI_COMMAND_* pairs), in dir, feeding stdin.
func execute(ctx context.Context, op run.Op, command string, in *CommandInputs, prev map[string]string) (string, string, error) {
	args := []string{"/bin/sh", "-c"}
	if in.Interpreter != nil && len(*in.Interpreter) > 0 {
		args = append([]string{}, *in.Interpreter...)
	}
	args = append(args, command)

	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	if in.Dir != nil && *in.Dir != "" {
		cmd.Dir = *in.Dir
	} else if wd, err := os.Getwd(); err == nil {
		cmd.Dir = wd
	}
	cmd.Env = os.Environ()
	if in.Environment != nil {
		for k, v := range *in.Environment {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	for k, v := range prev {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if in.Stdin != nil && *in.Stdin != "" {
		cmd.Stdin = strings.NewReader(*in.Stdin)
	}
	logMode := ""
	if in.Logging != nil {
		logMode = string(*in.Logging)
	}
	capture := run.NewCapture(ctx, logMode)
	cmd.Stdout = capture.StdoutWriter()
	cmd.Stderr = capture.StderrWriter()

	err := cmd.Run()
	capture.Flush()
	if err != nil {
		return "", "", capture.Failure(op, fmt.Errorf("%s: %w", args[0], err))
	}
	stdout, stderr := capture.Results()
	return stdout, stderr, nil
}
