"""The contract between the Pulumi program and its policy pack (issue 47).

The policy pack runs in its own virtualenv (policies/venv) and cannot import the program, so
what both sides must agree on lives here, once: sizes and reserves (`sizes`), the exact forms of
the values that name things and the shapes of secrets (`forms`), the component resource types
(`types`), the container label keys and roles (`labels`), the props each component hands the
pack (`props`, one TypedDict per component; docs/contract.md's "What policies see" is generated
from them by scripts/contract_doc.py), and the hub-manifest rules the program and the node
payloads share (`manifest`: also sent to the nodes as a payload prelude, so it stays one
self-contained file, hostscripts/common.py `payload`).

Standard library only, and nothing here imports the program or the pack (import-linter holds
it): it is installed into both environments (`make venv`: the program's editable install maps
this folder, policies/venv gets `pip install ./contract`), and imported from the repository root
as it stands (cwd-first) by the tests and by Pulumi's program.
"""
