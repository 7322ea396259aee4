package provider_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blang/semver"
	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi-go-provider/integration"
	presource "github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	"github.com/pulumi/pulumi/sdk/v3/go/property"

	"spark-vllm/lab/command/provider"
)

func server(t *testing.T) integration.Server {
	t.Helper()
	prov, err := provider.New()
	if err != nil {
		t.Fatal(err)
	}
	s, err := integration.NewServer(context.Background(), provider.Name, semver.MustParse("1.2.1"),
		integration.WithProvider(prov))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func urn(typ, name string) presource.URN {
	return presource.NewURN("test", "lab", "", tokens.Type("command:"+typ), name)
}

func schemaOf(t *testing.T) map[string]any {
	t.Helper()
	resp, err := server(t).GetSchema(p.GetSchemaRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(resp.Schema), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// findPython returns the project's venv python (which has the pulumi_command SDK).
func findPython(t *testing.T) string {
	if py := os.Getenv("SPARK_VLLM_PYTHON"); py != "" {
		return py
	}
	wd, _ := os.Getwd()
	for dir := wd; dir != "/"; dir = filepath.Dir(dir) {
		py := filepath.Join(dir, "venv", "bin", "python")
		if _, err := os.Stat(py); err == nil {
			return py
		}
	}
	t.Skip("no venv/bin/python above this package (run `make venv`); the SDK contract cannot be read")
	return ""
}

// TestSchemaCoversTheSDK: every resource token, input and output name, nested object
// property, enum value, default, required flag, secret output and replace-on-changes the
// pulumi_command SDK uses is in this provider's schema. The names come from the SDK source.
func TestSchemaCoversTheSDK(t *testing.T) {
	py := findPython(t)
	schema := schemaOf(t)
	raw, _ := json.MarshalIndent(schema, "", " ")
	file := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "../testdata/sdk_contract.py", "--schema", file).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the schema does not cover the SDK: %v", err)
	}
}

func TestSchemaSecretsAndReplace(t *testing.T) {
	res := schemaOf(t)["resources"].(map[string]any)
	remote := res["command:remote:Command"].(map[string]any)
	in := remote["inputProperties"].(map[string]any)
	if in["connection"].(map[string]any)["secret"] != true {
		t.Error("connection input is not secret")
	}
	if in["triggers"].(map[string]any)["replaceOnChanges"] != true {
		t.Error("triggers is not replaceOnChanges")
	}
	conn := schemaOf(t)["types"].(map[string]any)["command:remote:Connection"].(map[string]any)["properties"].(map[string]any)
	for _, k := range []string{"password", "privateKey", "privateKeyPassword"} {
		if conn[k].(map[string]any)["secret"] != true {
			t.Errorf("connection.%s is not secret", k)
		}
	}
}

func str(s string) property.Value { return property.New(s) }

func triggers(vs ...string) property.Value {
	arr := make([]property.Value, len(vs))
	for i, v := range vs {
		arr[i] = str(v)
	}
	return property.New(property.NewArray(arr))
}

func TestDiff(t *testing.T) {
	s := server(t)
	base := map[string]property.Value{
		"create": str("echo a"), "triggers": triggers("x"), "addPreviousOutputInEnv": property.New(true),
	}
	state := property.NewMap(base).Set("stdout", str("a")).Set("stderr", str(""))
	diff := func(inputs map[string]property.Value) p.DiffResponse {
		t.Helper()
		resp, err := s.Diff(p.DiffRequest{ID: "id", Urn: urn("local:Command", "d"), State: state,
			OldInputs: property.NewMap(base), Inputs: property.NewMap(inputs)})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	with := func(k string, v property.Value) map[string]property.Value {
		m := map[string]property.Value{}
		for k, v := range base {
			m[k] = v
		}
		m[k] = v
		return m
	}

	if d := diff(base); d.HasChanges || len(d.DetailedDiff) != 0 {
		t.Errorf("equal inputs must not diff: %+v", d)
	}
	d := diff(with("create", str("echo b")))
	if !d.HasChanges || d.DetailedDiff["create"].Kind != p.Update {
		t.Errorf("create change must be an update: %+v", d)
	}
	for name, tr := range map[string]property.Value{
		"element changed": triggers("y"), "element added": triggers("x", "y"), "removed": property.New(property.Null),
	} {
		d := diff(with("triggers", tr))
		replace := false
		for k, pd := range d.DetailedDiff {
			if strings.HasPrefix(k, "triggers") {
				switch pd.Kind {
				case p.AddReplace, p.UpdateReplace, p.DeleteReplace:
					replace = true
				}
			}
		}
		if !d.HasChanges || !replace {
			t.Errorf("triggers %s must replace: %+v", name, d)
		}
	}
}

func TestLocalLifecycle(t *testing.T) {
	s := server(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	u := urn("local:Command", "l")
	inputs := property.NewMap(map[string]property.Value{
		"create":      str("echo created >> " + marker + "; echo out; echo err >&2"),
		"update":      str("echo \"update saw $PULUMI_COMMAND_STDOUT\" >> " + marker + "; echo out2"),
		"delete":      str("echo \"delete saw $PULUMI_COMMAND_STDOUT\" >> " + marker),
		"stdin":       str("secret-stdin").WithSecret(true),
		"environment": property.New(map[string]property.Value{"LAB_VAR": str("v")}),
	})
	checked, err := s.Check(p.CheckRequest{Urn: u, Inputs: inputs})
	if err != nil || len(checked.Failures) > 0 {
		t.Fatalf("check: %v %v", err, checked.Failures)
	}
	if v := checked.Inputs.Get("addPreviousOutputInEnv"); !v.IsBool() || !v.AsBool() {
		t.Errorf("addPreviousOutputInEnv default: %v", v)
	}

	prev, err := s.Create(p.CreateRequest{Urn: u, Properties: checked.Inputs, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a preview ran the command")
	}
	if !prev.Properties.Get("stdout").IsComputed() {
		t.Errorf("stdout should be unknown in a create preview: %v", prev.Properties.Get("stdout"))
	}

	created, err := s.Create(p.CreateRequest{Urn: u, Properties: checked.Inputs})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.Properties.Get("stdout"); got.AsString() != "out" || !got.Secret() {
		t.Errorf("stdout = %v (want \"out\", secret because stdin is secret)", got)
	}
	if got := created.Properties.Get("stderr").AsString(); got != "err" {
		t.Errorf("stderr = %q", got)
	}
	if !created.Properties.Get("stdin").Secret() {
		t.Error("stdin echo lost its secretness")
	}

	updated, err := s.Update(p.UpdateRequest{ID: created.ID, Urn: u, State: created.Properties,
		OldInputs: checked.Inputs, Inputs: checked.Inputs.Set("create", str("true"))})
	if err != nil {
		t.Fatal(err)
	}
	if got := updated.Properties.Get("stdout").AsString(); got != "out2" {
		t.Errorf("update stdout = %q", got)
	}
	if err := s.Delete(p.DeleteRequest{ID: created.ID, Urn: u, Properties: updated.Properties}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(marker)
	want := "created\nupdate saw out\ndelete saw out2\n"
	if string(got) != want {
		t.Errorf("marker = %q, want %q", got, want)
	}
}

func TestLocalFailureCarriesStderrTail(t *testing.T) {
	s := server(t)
	u := urn("local:Command", "f")
	_, err := s.Create(p.CreateRequest{Urn: u, Properties: property.NewMap(map[string]property.Value{
		"create": str("for i in $(seq 1 50); do echo line$i >&2; done; exit 3"),
	})})
	if err == nil {
		t.Fatal("a failing command must fail the create")
	}
	msg := err.Error()
	for _, want := range []string{"create command failed", "exit status 3", "line50", "line31"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "line30\n") {
		t.Errorf("error should carry only the tail: %s", msg)
	}
}

func TestLocalRefusesUnimplementedInputs(t *testing.T) {
	s := server(t)
	resp, err := s.Check(p.CheckRequest{Urn: urn("local:Command", "a"), Inputs: property.NewMap(map[string]property.Value{
		"create": str("true"), "assetPaths": property.New([]property.Value{str("*.txt")}),
	})})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Failures) != 1 || resp.Failures[0].Property != "assetPaths" {
		t.Errorf("want one failure for assetPaths, got %+v", resp.Failures)
	}
}
