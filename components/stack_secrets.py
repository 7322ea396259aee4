"""StackSecrets: the secrets the stack makes for itself, once, kept as Pulumi secrets.

* The Ray cluster token (Ray's token authentication, `RAY_AUTH_MODE=token`: every Ray process
  and client must present it; https://docs.ray.io/en/latest/ray-security/token-auth.html).
  Ray's servers listen on every interface whatever `--node-ip-address` says, so without a
  token anyone on the management network could join the cluster or submit code.
* vLLM's API key, when the stack config gives none (`spark-vllm:vllmApiKey`): vLLM always
  listens beyond loopback here, so it never serves without a key. `pulumi stack output
  vllmApiKey --show-secrets` shows the generated one.
* The label key: a random key of the stack's own under which the API key's label is an
  HMAC-SHA256 (`secret_label`). A vLLM container carries `spark-vllm.api-key` so that a new key
  replaces it; an unsalted sha256 there let anyone who may `docker inspect` the node test
  guesses of the key offline (issue 31). The HMAC is the same for the same key, so nothing is
  replaced for nothing, and says nothing without the label key.

Each is a `local.Command` that runs once on the machine running Pulumi (no triggers: the value
stays in the state, encrypted, until the resource is replaced on purpose), its stdout marked
secret and never logged. Nothing here touches a node; RayCluster writes the token into a
root-only file on every node.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import pulumi
from pulumi_command import local

from contract import types

# 32 random bytes as 64 hex characters, from the OS's CSPRNG.
GENERATE = "python3 -c 'import secrets; print(secrets.token_hex(32))'"


@dataclass
class StackSecretsArgs:
    api_key: pulumi.Output[str] | None = None  # the configured key, if any


def secret_label(label_key: str, secret: str) -> str:
    """The label value that stands for `secret` on a container: HMAC-SHA256 under the stack's
    label key, hex."""
    return hmac.new(label_key.encode(), secret.encode(), hashlib.sha256).hexdigest()


class StackSecrets(pulumi.ComponentResource):
    ray_token: pulumi.Output[str]
    api_key: pulumi.Output[str]
    label_key: pulumi.Output[str]

    def __init__(
        self, name: str, args: StackSecretsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(
            types.STACK_SECRETS,
            name,
            {"apiKeyGenerated": args.api_key is None},
            opts,
        )
        self.ray_token = self._generated(f"{name}-ray-token")
        self.api_key = (
            args.api_key if args.api_key is not None else self._generated(f"{name}-vllm-api-key")
        )
        self.label_key = self._generated(f"{name}-label-key")
        self.register_outputs({"apiKeyGenerated": args.api_key is None})

    def api_key_label(self, written: pulumi.Output[str]) -> pulumi.Output[str]:
        """The `spark-vllm.api-key` label of a container whose key file the command with
        stdout `written` wrote: known once that write ran (as the file's hash was before).

        Not a secret: it tells nothing without the label key, and a secret element would make
        the container's whole `labels` secret, hiding every label's change from the preview."""
        return pulumi.Output.unsecret(
            pulumi.Output.all(written, self.label_key, self.api_key).apply(
                lambda a: secret_label(a[1], a[2])))

    def _generated(self, name: str) -> pulumi.Output[str]:
        made = local.Command(
            name,
            create=GENERATE,
            logging=local.Logging.NONE,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["stdout"]),
        )
        return pulumi.Output.secret(made.stdout.apply(lambda s: s.strip()))
