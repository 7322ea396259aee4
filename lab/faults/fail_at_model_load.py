# LAB ONLY FAULT (issue 49): appended to the lab's vLLM platform plugin
# (vllm_lab_cpu/platform.py) in a variant of the lab's serving image that lab/deployments.py
# `faulty_image` builds. Every process of vLLM in that image then fails while it loads the model:
# vLLM asks its platform for the attention backend as it builds the model's attention layers, in
# every worker (a Ray worker, an mp rank, the engine core's own), after the serve check and the
# image probe passed (they never build a model). It stands in for a new vLLM build that cannot
# load a model the last one served (eugr/spark-vllm-docker issues 121, 221, 226; vLLM issue
# 48477). The image without this layer is unchanged.


def _fail_at_model_load(cls, *args, **kwargs):
    raise RuntimeError("spark-vllm lab fault: this image's vLLM fails while it loads the model "
                       "(lab/faults/fail_at_model_load.py)")


LabCpuPlatform.get_attn_backend_cls = classmethod(_fail_at_model_load)  # noqa: F821
