"""Per-GPU memory of one pipeline stage: weights, gradients, optimizer state, activations, buffers, reserve.

Model states (ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054 sec. 5): a GPU holds the parameters of its
stage divided by TP (dense) or EP·ETP (routed experts), each in ``weight_dtype`` (2 B), with gradients in
``grad_dtype`` and optimizer state (master weights + 2 Adam moments) in ``optimizer_bytes``. ZeRO stage z
shards optimizer (z>=1), gradients (z>=2) and weights (z=3, FSDP) over the data-parallel group: dp·cp ranks
for dense weights (CP ranks hold the same weights, Megatron-Core's dp-cp group) and edp ranks for experts.
Megatron's distributed optimizer is z=1: its fp32 gradient buffer is not sharded.

Activations per micro-batch: per-token elements from :class:`autopar.cost.layer_sums.ModelProfile`, times
b·s/cp tokens, divided by TP for tensor-split tensors and by TP again for norm tensors only with SP
(Korthikanti et al. 2022, arXiv 2205.05198, sec. 4.2.2). Recompute policies drop what they recompute; full
recompute keeps each layer's input plus one layer's working set (sec. 5).

In-flight micro-batches (Narayanan et al. 2021 sec. 2.2): stage i of a 1F1B pipeline holds min(pp − i, M)
micro-batches; with the interleaved schedule rank i holds min(2(pp − i − 1) + (v − 1)·pp + 1, v·M)
model chunks of L_stage/v layers each (Megatron-LM's warm-up count), i.e. (1 + (pp−1)/(pp·v)) times the
1F1B figure on rank 0 (Korthikanti et al. sec. 4.2.3).

Activation offloading (Megatron-Core's CPU and fine-grained activation offloading; PyTorch's ``save_on_cpu``
saved-tensor hooks): a fraction f of the stored activations leaves for host memory as each layer's forward
finishes and comes back before its backward, double-buffered, so for that fraction the GPU holds two layers'
worth of one micro-batch (the one computing and the one in transfer) instead of all in-flight micro-batches;
the rest sits in host DRAM (reported, see :func:`offloaded_activation_bytes`). f < 1 stands for offloading some
modules' tensors, approximated as a share of the bytes. The transfer time is in :mod:`autopar.cost.offload`.

Logits: the last stage keeps one micro-batch's vocab-parallel logits, b·s/cp · V/tp elements, and what the
loss kernel holds on top of them per element (:data:`LOGIT_EXTRA_BYTES`): the fused cross entropy (Megatron's
vocab-parallel cross entropy with ``--cross-entropy-loss-fusion``, Transformer Engine) keeps the fp32 softmax
it needs for the backward (4 B); the unfused one (plain torch ``log_softmax`` on upcast logits, as autopar's
runner) holds the fp32 upcast (4 B), the saved fp32 log-softmax output (4 B) and, at the start of the backward,
its fp32 gradient (4 B) at once.

PyTorch's loss path (``TrainingSpec.loss_runtime`` 'torch', as torchtitan runs it), per logit element:
- the trainer drops its bf16 logits before the backward (pytorch/torchtitan@9dec370 train.py: ``del pred``, "need
  to free to before bwd to avoid peaking memory"), so at the loss backward's peak only fp32 tensors are alive;
- without TP, ATen's log_softmax saves its fp32 output and its backward holds that output, the nll backward's fp32
  gradient and its own fp32 result: 12 B;
- with TP the loss runs through DTensor loss_parallel (torch/distributed/tensor/parallel/loss.py): its
  ``_nll_loss_and_log_softmax_backward`` computes ``(zeros_like(x) + exp(x)) * grad_output`` in separate fp32 ops
  beside the saved fp32 log-softmax ``x``: 16 B at its peak;
- the final norm runs outside the compiled blocks (torchtitan@9dec370 ``apply_compile`` compiles each
  TransformerBlock only) and in eager RMSNorm (torchtitan/models/norms.py ``RMSNorm``, read at
  pytorch/torchtitan@026e23a, 2024: ``self._norm(x.float()).type_as(x) * self.weight``) autograd keeps the fp32
  upcast x (saved by ``pow`` and ``mul``, 4 B) and the bf16 normalised tensor (saved by the weight ``mul``, 2 B) per
  element of its (sequence-parallel) input until the head's backward: :data:`TORCH_FINAL_NORM_BYTES` per token·h on
  the last stage, for the one micro-batch whose loss backward has not run (it follows its forward), beside the head's
  saved input (the gathered-input buffer);
- under PP, torch.distributed.pipelining's last stage appends every micro-batch's output (the bf16 logits) to
  ``output_chunks`` for the step's output merge (torch/distributed/pipelining/stage.py
  ``_PipelineStageBase.forward_one_chunk``), so M micro-batches' logits stay until the step ends: + M · 2 B;
- the caching allocator holds the activation dtype's bytes per logit element more than the tensors alive at the loss
  backward's peak (:func:`torch_loss_bytes`); the likely mechanism, read from the allocation order and not traced:
  the freed bf16 logits' block (2 B per element, beside the fp32 upcast's once both are freed) serves one fp32
  gradient, and the next fp32 tensor no longer fits in what is left, so it stays cached beside the peak. Measured with benchmarks/torch_sac_memory.py (one H200, torch 2.11.0+cu130,
  ``expandable_segments:True`` as torchtitan's run script sets it, 2026-11-26; Llama 3.1 8B blocks, 2 x 8192 tokens,
  2.10e9 logit elements): the peak reserved exceeds the peak allocated by 4.04-4.29 GiB in all eight variants (eager
  and compiled, op SAC and full AC, 2 and 6 layers), 2.07-2.19 B per logit element, and the peak allocated is the
  loss phase's 12 B per element, the stored activations and the final norm's tensors to within 0.1 GiB.

Compiled (``cross_entropy`` 'compiled': torchtitan wraps the same loss in ``torch.compile`` with
``--training.compile`` from pytorch/torchtitan@bbb1b616e, 2025-04-02; torchtitan/components/loss.py
``build_cross_entropy_loss`` at e7c0cae): AOTAutograd's partition and Inductor's fused kernels replace the eager
temporaries. Measured with benchmarks/torch_compiled_loss_memory.py (torch 2.13.0+cpu, Inductor's C++ backend,
2026-11-26, 1024 x 128256 bf16 logits), per logit element:
- without TP the partition saves the bf16 logits themselves (2 B; with per-token max and log-sum-exp), so ``del
  pred`` frees nothing; the backward is one fused kernel that re-reads them and writes the bf16 gradient (2 B):
  4 B at the backward's peak, 2 B at the forward's, no fp32 tensor of the logits' size at all;
- with TP, DTensor loss_parallel's handlers trace into the graph: the forward materialises the zero-filled fp32
  one-hot matrix its index_put scatters into (4 B) and the fp32 ``one-hot + exp(log-softmax)`` it saves (4 B)
  beside the bf16 logits (2 B): 10 B at the forward's peak, 6 B at the backward's (the saved fp32 tensor and the
  bf16 gradient);
- both peaks hold the bf16 logits; under PP torch.distributed.pipelining keeps them anyway (``output_chunks``,
  below), so there they are counted once;
- the partition (which tensors are saved, in which dtype) does not depend on the device; which intermediates Inductor
  materialises is its scheduler's choice, read here on the C++ backend, and the Triton backend's buffers were not
  measured: APPROXIMATE on CUDA. The caching allocator's extra block of the eager path has no counterpart counted:
  without TP the logits are not freed before the peak and no tensor larger than them is allocated; with TP the
  peak is the forward's, before ``del pred`` frees any block (read from the allocation order, not traced on a GPU).

Phases (``loss_runtime`` 'torch', last stage): the loss backward's peak (the loss bytes above and the final norm's
saved tensors) comes before any layer's backward, and one layer's backward working set (:func:`activation_elems_per_
token`) after the loss temporaries are freed, so the stage holds the stored activations, the stage buffers and the
larger of the two, not their sum; Megatron's path keeps the sum (its loss bytes are the smaller share, and its runs
are not measured here). The gradient term stays in both phases: with FSDP2 and AdamW (the same benchmark, ``--fsdp``)
the reserved peak exceeds the allocated one by the loss path's bytes and 1.0 x the fp32 gradients' size, the
blocks ``zero_grad`` frees and the allocator keeps cached through the next loss peak.

Ring attention (``TrainingSpec.cp_ring`` 'torch_allgather', CP > 1: torch.distributed.tensor.experimental's
context_parallel as torchtitan@9dec370 runs it, ``--experimental.context_parallel_rotate_method`` 'allgather' by
default; torch/distributed/tensor/experimental/_attention.py read at a stored pytorch/pytorch@f2127dbd, with the
all-gather rotater of pytorch/pytorch#132820, 2024-08, and ``set_rotate_method`` of #142093, 2024-12-05, both
before the 2024-12-23 torch 1963fc8 of the torchtitan tables; the loops ASSUMED unchanged since, as
:mod:`autopar.cost.cp` does). Inside one attention layer's backward, with K, V repeated to every local query head
before SDPA (torchtitan models/llama/model.py ``repeat_kv``), KV = b·s/cp · a/tp · (d_qk + d_v) elements of K and V
together and Q = b·s/cp · a/tp · d_qk, ``_templated_ring_attention_backward`` holds at a ring step i >= 1:
``_AllGatherRotater``'s gathered K/V of all cp ranks (cp·KV, activation dtype), the fp32 dQ accumulator
(``torch.zeros_like(query, dtype=float32)``: 4·Q B), three fp32 dK/dV buffers (the one received from the previous
rank, which ``grad_key += grad_key_`` updates in place, its ``torch.cat`` for the next send and the all-to-all
rotater's ``permute_tensor`` output: 3 · 4·KV B) and the flash backward's dQ, dK, dV of that step (activation dtype,
Q + KV): :func:`torch_ring_backward_bytes`. These belong to the layer phase (the larger of it and the loss phase on a
torch last stage). The forward's ring (the same gather, the fp32 merge of the outputs, about 18 B per output element)
holds less and is over before the backward's starts. At torchtitan's 8B CP rows (TP 1, 32K tokens per GPU) the loss
phase stays the larger at every CP (the measured 83.9-84.5 GiB are flat in CP); at 405B (TP 8, PP 8) the first
stages have no loss phase and grow with CP, by 2.6 GiB at CP 2 and 4.1 GiB at CP 8.

Transformer Engine's ring attention (``TrainingSpec.cp_ring`` 'te_p2p', CP > 1: Megatron-Core's default
``--cp-comm-type p2p``; ``AttnFuncWithCPAndKVP2P`` in transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py, read at NVIDIA/TransformerEngine@d0067d0d, 2026-08-22, BF16 path). With T = b·s/cp local tokens,
KV = T·max(g/tp, 1)·(d_qk + d_v) elements of K and V together (TE receives K and V as the layer has them: g KV heads,
MLA's up-projected a heads), Q = T·(a/tp)·d_qk and O = T·(a/tp)·d_v, one attention layer holds beyond its own
tensors, for one micro-batch:
- in its forward (and its recomputed forward): the ring's receive buffers, all kept in ``p2p_comm_buffers`` until the
  function returns (``torch.cat((k.view(-1), v.view(-1)))`` then one ``torch.empty_like`` per step: cp·KV); every
  step's output (``out_per_step``, cp·O: full-size on the last rank, whose steps all see the first half of the keys;
  the published peak is the fullest GPU's) until the final correction loop; that loop's fp32 output
  (``flash_attn_fwd_out_correction_init``: "out in torch.float32", 4 B·O) and its cast back (``out_part``, e·O):
  e·cp·(KV + O) + (4 + e)·O bytes;
- in its backward: ``dq_buffer`` (Q), two ``torch.empty((2, *kv.shape))`` send/receive buffers of K/V with their
  gradients (4·KV) and one step's dQ, dK, dV from the flash backward (Q + KV): e·(2·Q + 5·KV) bytes.
The larger of the two belongs to the layer phase (:func:`te_ring_bytes`). It matters where K/V are wide: MLA (DeepSeek
V2/V3, 128 heads of d_qk 192 + d_v 128, no KV-head sharing) at 128K tokens, CP 8 and TP 1 holds 15.5 GiB in the
forward; GQA models hold little (Llama 3 70B at TP 8: 0.4 GiB, Qwen3-235B at TP 4: 0.75 GiB). FP8 attention
(other buffers: an fp32 dQ and fp32 dK/dV accumulators) is counted with the BF16 bytes,
an approximation.

torch.distributed.pipelining's stage buffers (``loss_runtime`` 'torch', the PyTorch pipeline runtime torchtitan drives;
torch/distributed/pipelining/stage.py, read at pytorch/pytorch@0138610, the same structure as the Dec 2024 release
the torchtitan tables ran): ``_prepare_backward_infra`` creates, for every micro-batch of the step, a gradient-receive
buffer per stage output (``_create_grad_recv_info``: ``_make_tensor_from_meta``, i.e. ``torch.empty``) on every
stage but the last; the forward infra likewise one activation-receive buffer per micro-batch on every stage but the
first; both are kept from one step to the next (``clear_runtime_states`` drops only their ``.grad``).
``forward_one_chunk`` keeps each micro-batch's stage output in ``fwd_cache`` until its backward
(``self.fwd_cache[fwd_chunk_id] = (output_tuple, flatten_input_tensors)``) and, at that release, also appends it to
``output_chunks`` on EVERY stage, not only the last (``self.output_chunks.append(output)``, unconditional until
pytorch/pytorch#153383, merged 2025-05-13: "Considering output_chunks is only used for last stage, we should not
keep the outputs of each stage in memory"), where it stays until the next step's ``clear_runtime_states``: by the
last forward of a step every stage holds all M of its outputs (the in-flight ones among them), unlike Megatron,
which frees its sent outputs' storage (``deallocate_output_tensor``). Each is one stage-boundary tensor,
b·s/(cp·tp)·h elements with SP (torchtitan's blocks hand on their sequence-sharded local output), b·s/cp·h without.
With v model chunks per rank, M micro-batches and c in-flight chunks (:func:`inflight_layer_microbatches` · v), a
rank holds

    v·M − M·[last rank]                 gradient-receive buffers,
    max(v·M − M·[first rank] − c, 0)    activation-receive buffers beyond the c counted as stored layer inputs,
    v·M − M·[last rank]                 kept stage outputs (``output_chunks``; the last stage's outputs are its
                                        logits, counted above)

boundary tensors (:func:`pipeline_boundary_tensors`). The outputs count at the rank's activation peak because the
stored inputs stay at c from the end of the warm-up to the last forward, while the kept outputs only grow: the
peak, at the last forward, holds c chunks' stored inputs and all v·M outputs (exact for v = 1; for interleaved
ranks the in-flight count is Megatron's warm-up figure, an approximation).

Buffers: the SP/TP all-gathered input of one linear (b·s/cp·h), EP dispatch/combine buffers (2·b·s/(cp·tp)
·k·h), FSDP's unsharded parameters of two layers (current + prefetch) and one layer's unsharded gradient (FSDP2's
own count below),
FP8 weight copies (2 B per local parameter, Transformer Engine; none with FP8 primary weights) for FP8 recipes.
Async TP (``tp_overlap_impl: async_tp``) adds its symmetric-memory workspace, allocated once and kept: the fused
matmul + reduce-scatter double-buffers one output chunk, 2·(b·s/(cp·tp))·h·e bytes, more than the fused all-gather's
one input shard (torch ``torch/distributed/_symmetric_memory/__init__.py`` ``_pipelined_produce_and_all2all``:
``p2p_workspace_size_req = out_chunks[0].numel() * out_chunks[0].element_size() * 2``, ``get_symm_mem_workspace``).

FP8 weights (Transformer Engine): each weight is kept in FP8 twice, row-wise for the forward GEMM and column-wise
(its transpose) for the backward's data-gradient GEMM, which FP8 tensor cores take only in the TN layout (Hopper)
or with scales along the other dimension (MXFP8): 2 B per local parameter (TE ``Float8Tensor``'s cached
transpose, ``quantizer.set_usage(rowwise=True, columnwise=True)`` for weights in training). torchao's Float8Linear
(``fp8_recipe`` tensorwise / rowwise, torchtitan) keeps no FP8 copy: it casts each weight and input when its GEMM
runs and saves the high-precision tensors for the backward (pytorch/ao torchao/float8/float8_linear.py,
``matmul_with_hp_or_float8_args.forward``: ``ctx.save_for_backward(input_hp, weight_hp_t)``), so only the layer
being computed holds FP8 casts (2 B per parameter of one layer), and stored GEMM inputs stay in bf16.

FP8 primary weights (``TrainingSpec.fp8_param_gather``: Megatron ``--fp8-param-gather``, Bridge
``mixed_precision.fp8_param_gather``, which its fp8 current-scaling and MXFP8 presets set: Megatron-Bridge@fcbb6031
src/megatron/bridge/training/mixed_precision.py lines 302, 278-280): the model is built under Transformer Engine's
``fp8_model_init``, so each GEMM weight IS its FP8 tensor (row-wise and column-wise data, 2 B per parameter) and
no bf16 copy is kept beside it; the fp32 main weights live in the distributed optimizer, which quantises its shard
straight into the FP8 parameter after the step (Megatron-LM d98e8a64 megatron/core/fp8_utils.py:386-400
``quantize_param_shard``; transformer_config.py:602 ``fp8_param``: 'keep the parameters in fp8 precision to save
memory'). The weights' 2 B per parameter then stand for the FP8 pair and the FP8 copy buffer is not charged on
top: the memory falls by the bf16 copy, 2 B per local parameter. Approximations: the MXFP8 scales (1 B per 32
elements, about 3%) and the bf16 norms, biases and embeddings (which TE does not quantise; counted at the same
2 B) are not told apart.

The optimizer step (after the backward, when the activations are gone): Megatron-Core's optimizers hand the
inner Adam an fp32 gradient, ``shard_main_param.grad = shard_model_grad.float()``
(NVIDIA/Megatron-LM megatron/core/optimizer/distrib_optimizer.py ``_copy_model_grads_to_main_grads``; the same
``.float()`` in optimizer.py's Float16OptimizerWithFloat16Params). With gradient buffers in bf16 that is a new
4 B copy of every gradient the rank updates (its 1/dp·cp shard under the distributed optimizer); with fp32
buffers ``.float()`` returns the buffer itself. So the step holds the model states plus that copy while the
training peak holds the model states plus activations and buffers: the peak is the larger,

    peak = states + max(activations + buffers, grad copy)       (:func:`step_grad_copy_bytes`)

and the breakdown reports the excess of the copy, if any, under buffers. This is what param-heavy slices with
little activation memory (a few layers of a 405B model on one node at DP 1) were under-predicted by. FSDP
(ZeRO-3) reduce-scatters into fp32 shards directly: no copy is counted there.

FSDP2's root module (``TrainingSpec.dp_impl`` fsdp2 at ZeRO-3): torchtitan@9dec370 parallelize_llama.py
``apply_fsdp`` wraps each TransformerBlock and then the whole model (``fully_shard(model, ...)``), whose own
parameters are the token embedding, the final norm and the output head. FSDP2 never reshards the root after its
forward (torch/distributed/_composable/fsdp/_fsdp_state.py@1963fc8 ``FSDPState._lazy_init``: "For the root, do not
reshard after forward since for training, the parameters would be freed and all-gathered immediately":
``post_forward_mesh_info = None``), and the root's post-backward runs only after the embedding's backward, so the
root's unsharded bf16 parameters, ``weight_bytes`` per (embedding + head)/tp parameter on the stages that hold them,
are gathered for the whole forward and backward, beside the per-layer gathers above (:func:`fsdp2_root_bytes`).
Under PP torchtitan keeps every FSDP2 unit gathered (``pp_fsdp`` per_step, priced as ZeRO-1): nothing extra there.

FSDP2's per-block buffers (``dp_impl`` fsdp2; Megatron's ZeRO-3 keeps the count under Buffers). Read in torch's
FSDP2 of the 2.6 line (torch/distributed/fsdp/_fully_shard/, a stored copy with ``unshard_in_backward`` and without
``all_reduce_hook``, i.e. Dec 2024 - Jan 2025; the tables' 1963fc8 itself is not stored and is ASSUMED the same, so
functions are cited, not lines). With P parameters of one block on this TP rank (:func:`fsdp2_block_params`; torchtitan
wraps each TransformerBlock) and the block's dtypes bf16 (param_dtype) and fp32 (reduce_dtype):

- ``_fsdp_collectives.foreach_all_gather``: the all-gather input is a view into its flat output
  (``all_gather_output.narrow(0, all_gather_input_numel * rank, ...)``), allocated on the all-gather copy-in stream,
  2 B·P; the fp32 shards' bf16 casts (``FSDPParam.all_gather_inputs``, 2 B·P/N) are freed after the copy-in (left
  out). ``foreach_all_gather_copy_out`` copies it into the unsharded parameters (``alloc_all_gather_outputs``, 2 B·P,
  on the compute stream), which ``to_sharded`` frees after the block's forward and its backward.
- ``FSDPParamGroup.wait_for_unshard``: in the forward the flat output is kept in ``comm_ctx.all_gather_state`` until
  the next group's copy-out ("Defer free to allow for overlap of this copy-out with next all-gather collective"), and
  the next group's all-gather is issued before that: two flat outputs are alive at once, the root's (embedding and
  head, gathered first) with the first block's, then two blocks'. In the backward ``_backward_prefetch`` gathers the
  next block while one computes; its flat output is freed after its copy-out. The copy-in stream's blocks serve
  only that stream, so the caching allocator keeps them reserved all step: weight_bytes·(max(root, P) + P)
  (:func:`fsdp2_all_gather_pool_bytes`; none on one rank, where newer torch even skips the flat buffer:
  torch 2.13.0 ``FSDPParamGroup.unshard`` ``if world_size == 1``; whether the torch 2.11 of the one-H200 measurement
  above did is not checked, and on one rank the pool is not counted either).
- ``FSDPParamGroup.post_backward``: autograd's unsharded gradients are in param_dtype (2 B·P, the block's, growing
  through its backward); the block is resharded, then ``foreach_reduce`` allocates the reduce-scatter input in
  reduce_dtype on the compute stream (``torch.empty((reduce_scatter_input_numel,), dtype=reduce_dtype)``, 4 B·P),
  copies the gradients in and frees them (``unsharded_grads.clear()``); the input is kept in
  ``comm_ctx.reduce_scatter_state`` until the NEXT group's ``post_backward`` waits on its event and drops it, so
  through the next block's backward the previous block's fp32 input (4 B·P) sits beside that block's bf16
  gradients (2 B·P). The reduce-scatter output (4 B·P/N, on the reduce-scatter stream) becomes the sharded
  ``.grad``: the gradient term.
- the root module (``fully_shard(model)``) reduces only after the whole backward, so the head's unsharded bf16
  gradient (2 B per head parameter) is held from the head's backward to the end.

So the buffers hold, in every phase, one gathered block (2 B·P: in the forward, and at the loss backward's peak the
last block, which torchtitan does not reshard after its forward), the root's gathered parameters and the copy-in
pool; and a layer's backward adds (2 + 4) B·P and the head's gradient (:func:`fsdp2_backward_bytes`), which belong to
the layer phase: on the torch last stage they count only where that phase is the larger (at torchtitan's 8B rows the
loss backward's peak, 27-55 GiB, is). Under PP with ``pp_fsdp`` per_step the gradients accumulate unsharded in fp32
(``to_accumulated_grad_if_needed``), so a backward adds only the block's bf16 gradients there. Approximations: the
layer-phase bytes are counted for ``dp_impl`` fsdp2 at any ZeRO stage (the search's activation tables have no ZeRO
axis), an over-count of at most 6 B·P for torchtitan layouts below ZeRO-3; P is the stage's average block.

FSDP under PP with ``pp_fsdp`` per_step (torchtitan + torch.distributed.pipelining, autopar.cost.dp): torchtitan@9dec370
parallelize_llama.py ``apply_fsdp`` sets reshard_after_forward = False under PP, and pipelining's
``backward_maybe_with_nosync`` turns gradient sync and resharding off until the stage's last micro-batch, so FSDP2
holds the stage's parameters gathered (bf16) and accumulates unsharded fp32 gradients for the whole step; only the
optimizer state stays sharded. Whatever ZeRO stage >= 2 the layout names, a GPU holds ZeRO-1's bytes
(:func:`held_zero_stage`), as ``validate`` reads torchtitan's published PP rows.

FSDP2's shards (``dp_impl`` fsdp2 at ZeRO-3): torchtitan@9dec370 builds the model in fp32 and hands it to
``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; FSDP2 keeps each sharded
parameter in its own dtype (the fp32 shard is what AdamW updates: the master weights of ``optimizer_bytes``) and
makes bf16 only as the all-gather's input and output (torch/distributed/_composable/fsdp/_fsdp_param.py
``FSDPParam``: ``_sharded_param_data`` in the original dtype, cast to ``param_dtype`` for the all-gather). So no bf16
shard is held beside it: the weights term is 0 and the gathered bf16 layers are the buffers above.

Reserve: ``hardware.reserve_gib`` (CUDA context, NCCL, allocator) plus ``hardware.fragmentation`` of the
rest (caching-allocator fragmentation).

NCCL's own buffers are one flat part of that reserve, not a count of communicators. They are real HBM and do grow
with the process groups a rank uses. NCCL allocates them per channel and per peer: 4 MiB SIMPLE, 512 KiB LL and
4.7 MiB LL128 per connection (nccl@v2.21.5-1 src/init.cc DEFAULT_*BUFFSIZE; torch 2.5/2.6 wheels pin
nvidia-nccl-cu12==2.21.5). "More communicators = more memory used", linear in channels (sjeaugey, NVIDIA/nccl#864
and #986). On 8 x H100 one
all_to_all_single took NCCL's memory from 1.06 to 4.34 GB (NVIDIA/nccl#1685, 2025-04).
NCCL allocates those buffers itself, with cuMemCreate or cudaMalloc (nccl@v2.21.5-1 src/include/alloc.h
``ncclCudaCalloc``). Async TP's symmetric memory is allocated the same way (torch/csrc/distributed/c10d/
CUDASymmetricMemory.cu ``CUDASymmetricMemoryAllocator::alloc``). So none of it is in the PyTorch caching
allocator's ``reserved_bytes``, the figure torchtitan prints (#1685: its numbers "excluded memory usage from
PyTorch"), and no published peak here can measure a per-communicator term. The published pairs also contradict it.
Some pairs use the same process groups yet differ by 4.3-10 GiB: eager vs async TP, 1F1B vs interleaved. Another
pair differs by 7.8 GiB where CP 8 adds no group over CP 4. Pricing it costs the planner too. An uncommitted
patch, measured 2026-11-26, added 1.0 GiB per group beyond the first (TP, CP, DP, EP, one per pipeline peer). It
moved the 405B CP 1/2/4 rows 0.93-0.94 -> 0.97-1.00, 1F1B 0.84 -> 0.88 and CP 8 0.86 -> 0.90. At 1.0 GiB, and
already at 0.25 GiB, it drove l3paper-405b-h100-16384 from VPP 8 to VPP 1 (74.4 GiB of 74.5 at V >= 2). In-sample
error rose 7.90% -> 8.02%, and l3paper held out 15.3% -> 21.3%. So it is not priced
(benchmarks/nccl_reserve_trade.py). The same tables also bound it. The 405B CP 8 rank (TP, CP and FSDP groups, two
pipeline peers, async TP's symmetric memory) printed 84.9 GiB reserved on an 89.41 GiB GPU
(hardware/h100_grand_teton.yaml). So everything outside the allocator held at most 4.5 GiB there: CUDA context,
NCCL and symmetric memory together. The flat 3 GiB lies within that bound. 3 GiB plus more than 0.5 GiB for each of
that rank's groups beyond the first (3, as the script counts them) would not.
"""

from __future__ import annotations

import operator

from autopar.cost._select import maximum, minimum, where
from autopar.cost.cp import ring_q_o_elems, torch_ring_kv_elems
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.result import GIB, MemoryBreakdown
from autopar.cost.stage import Stage, memoised
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec

_FP8 = ("fp8", "fp8_block", "mxfp8", "nvfp4")


def stage_params(prof: ModelProfile, st: Stage, L: Layout) -> tuple[float, float]:
    """(dense, expert) parameters this GPU holds before ZeRO sharding. The degrees (``L.tp``, ``L.ep``, ``L.etp``)
    may be numpy arrays over meshes (elementwise result). With plain-int degrees the result is kept in the stage's
    memo (an estimate asks for it four times per stage): it reads nothing of the layout but these three degrees."""
    tp, ep, etp = L.tp, L.ep, L.etp
    return memoised(st.memo, "stage_params", (tp, ep, etp), _stage_params, prof, st, tp, ep, etp)


def _stage_params(prof: ModelProfile, st: Stage, tp, ep, etp) -> tuple[float, float]:
    """:func:`stage_params` from the three degrees alone (ints or numpy arrays)."""
    dense = st.sum(prof, "dense_params") / tp
    # KV heads fewer than TP: each rank keeps one whole KV head (replicated)
    dense = dense + where(tp > prof.kv_heads, st.sum(prof, "kv_params") * (1.0 / prof.kv_heads - 1.0 / tp), 0.0)
    if st.is_first:
        dense += prof.embedding_params / tp
    if st.is_last:
        dense += prof.head_params / tp
        if prof.model.tie_embeddings and st.pp > 1:
            dense += prof.embedding_params / tp  # the last stage keeps its own copy of a tied embedding
    expert = st.sum(prof, "expert_params") / (ep * etp)
    if st.is_last and prof.mtp_params:
        m = prof.model
        mtp_expert = m.mtp_layers * m.mtp_module_expert_params
        dense += (prof.mtp_params - mtp_expert) / tp
        expert += mtp_expert / (ep * etp)
    return dense, expert


def shard_groups(L: Layout) -> tuple[int, int]:
    """(dense, expert) ZeRO sharding group sizes (elementwise when the degrees are numpy arrays)."""
    dense = L.dp * L.cp
    expert = L.edp
    if L.hsdp_shard:
        dense = min(dense, L.hsdp_shard)
        expert = min(expert, L.hsdp_shard)
    return dense, expert


def inflight_layer_microbatches(st: Stage, L: Layout) -> float:
    """Micro-batches' worth of this stage's layer activations alive at the 1F1B peak. ``L.grad_accum`` and
    ``L.vpp`` may be numpy arrays (the search's tables): the result is then elementwise."""
    M = L.grad_accum
    chunks = minimum(2 * (st.pp - st.index - 1) + (L.vpp - 1) * st.pp + 1, L.vpp * M)
    return where(L.vpp == 1, 1.0 * minimum(st.pp - st.index, M), chunks / L.vpp)


def linear_input_scale(tr: TrainingSpec) -> float:
    """Stored size of a GEMM input relative to the activation dtype. FP8 recipes (Transformer Engine) keep the
    FP8 cast of each linear layer's input for the weight-gradient GEMM instead of the bf16 tensor: 1 byte, not 2."""
    if tr.precision in _FP8 and tr.fp8_recipe in TORCHAO_RECIPES:
        return 1.0        # torchao saves input_hp (module docstring)
    return 1.0 / tr.activation_bytes if tr.precision in _FP8 else 1.0


# The Layout fields _activation_elems_per_token reads: the key of its memo in the stage (with ``lin``; the profile and
# its training spec are the stage's own). A term that comes to read another field must add it here
# (tests/cost/test_estimator_cache.py checks a key without any one of them fails).
ACT_ELEMS_FIELDS = ("tp", "cp", "sp", "recompute")
_act_elems_key = operator.attrgetter(*ACT_ELEMS_FIELDS)


def activation_elems_per_token(prof: ModelProfile, st: Stage, L: Layout,
                               lin: float = 1.0) -> tuple[float, float]:
    """(stored elements per token of one micro-batch over the stage, working set of one layer) per GPU.
    The working set is what backward re-materialises for one layer at a time: the whole layer under full
    recompute, the dropped tensors of one layer under module recompute, nothing without recompute.

    Tokens here are the b·s tokens of a micro-batch of one data-parallel rank; divided by tp·cp (or cp for
    norm tensors without SP). ``lin`` scales the tensors that are GEMM inputs (norm outputs, attention
    output, the MLP activation output, routed tokens entering the experts): see :func:`linear_input_scale`.
    The degrees may be numpy arrays over meshes (elementwise result).
    With plain-number degrees the result is kept in the stage's memo (an estimate asks for it once per stage, the
    search once per mesh), keyed by :data:`ACT_ELEMS_FIELDS` and ``lin``."""
    return memoised(st.memo, "activation_elems_per_token", (*_act_elems_key(L), lin),
                    _activation_elems_per_token, prof, st, L, lin)


def _activation_elems_per_token(prof: ModelProfile, st: Stage, L: Layout, lin: float) -> tuple[float, float]:
    """:func:`activation_elems_per_token`, priced: reads only the fields in :data:`ACT_ELEMS_FIELDS` of ``L``."""
    sp_div = L.cp * where(L.sp, L.tp, 1)
    tp_div = L.tp * L.cp
    n = st.n_layers
    norm_in = st.sum(prof, "act_norm_in")
    norm_out = st.sum(prof, "act_norm_out")
    qkv = st.sum(prof, "act_qkv")
    attn_out = st.sum(prof, "act_attn_out")
    mlp = st.sum(prof, "act_mlp")
    shared = st.sum(prof, "act_shared")
    moe = st.sum(prof, "act_moe_io") + st.sum(prof, "act_moe_latent") + st.sum(prof, "act_moe_inner")
    # GPT-OSS's eager clamps keep one more copy of the fc1 output (autopar.blocks.moe CLAMP_STORED), except where
    # the clamps run inside fused kernels (TE's grouped MLP) or a compiled region
    tr = prof.training
    clamp = 0.0 if (tr.fused_grouped_mlp or tr.elementwise == "compiled") else st.sum(prof, "act_moe_act_clamp")
    moe = moe + clamp
    # the routing weights' multiply, where it is an fp32 multiply of its own (MOE_WEIGHTING_ELEMS)
    moe = moe + MOE_WEIGHTING_ELEMS[tr.moe_weighting] * st.sum(prof, "act_moe_io")
    # Unfused attention (before FlashAttention) materialises the s x s scores: softmax output (2 B), dropout
    # mask (1 B) and dropout output (2 B) per score, 5·a·s²·b bytes per layer (Korthikanti et al. 2022, arXiv
    # 2205.05198 eq. 1), i.e. 2.5 two-byte elements per score, a·s scores per token.
    scores = (2.5 * n * prof.model.num_attention_heads * tr.seq_len
              if tr.attention_kernel == "unfused" else 0.0)
    attn_out += scores
    full_layers = (norm_in + norm_out) / sp_div + (qkv + attn_out + mlp + shared + moe) / tp_div
    working = full_layers / max(n, 1)
    if L.recompute == "full":
        # Only each layer's input (h per token) is kept; one layer is rebuilt at a time in backward.
        return n * prof.hidden / sp_div, working
    mods = L.recompute_modules
    if tr.selective_ac == "op" and mods == {"core_attn"}:
        # torchtitan's op-level SAC (autopar/cost/compute.py OP_SAC_SHARE) keeps, per layer: the block input (one of
        # its two norm inputs), the saved matmul outputs (Q and V of Q, K, V; the first of a gated MLP's three
        # internals, or of a plain MLP's two; the down projection's output before its reduce-scatter, h per token
        # on every TP rank) and SDPA's output; it drops the norm outputs, K, the activation and the out-projection
        # output. Routed experts keep what Megatron's selective policy keeps. An approximation for pre-norm
        # attention + MLP blocks (torchtitan's Llama), stated in the stack file.
        # Eager autograd keeps every MUST_SAVE output whether or not the backward reads it (torch/utils/checkpoint.py
        # _CachingTorchDispatchMode stores each MUST_SAVE op's output); under torch.compile the partitioner saves only
        # what the backward graph reads, and nothing reads the down projection's output (its residual add's backward
        # needs no input): compiled blocks keep 1 h per token and layer less. Measured (benchmarks/
        # torch_sac_memory.py, one H200, torch 2.11.0+cu130, 2026-11-26, Llama 3.1 8B blocks at 2 x 8192 tokens):
        # 7.766 h per layer eager, 6.766 h compiled (the 0.016 h is SDPA's fp32 log-sum-exp).
        m = prof.model
        a, g = m.num_attention_heads, m.kv_heads
        kept = (norm_in / 2) / sp_div + (qkv * (a + g) / (a + 2 * g) + attn_out + mlp / (3 if m.gated_mlp else 2)
                                         + shared + moe) / tp_div + n * prof.hidden / L.cp
        working = where(full_layers > kept, full_layers - kept, 0.0) / max(n, 1)
        if tr.elementwise == "compiled":
            kept = kept - n * prof.hidden / L.cp
        return kept, working
    if "core_attn" in mods:
        attn_out = 0.0
    if "layernorm" in mods:
        norm_out = 0.0
    if "mlp" in mods:
        mlp = 0.0
    if "shared_experts" in mods:
        shared = 0.0
    if "moe" in mods:
        moe = 0.0
    elif "moe_act" in mods:
        moe -= st.sum(prof, "act_moe_act") + clamp
    if "mla_up_proj" in mods:
        qkv -= st.sum(prof, "act_mla_up")
    if lin != 1.0:
        gated = prof.model.gated_mlp
        norm_out *= lin
        attn_out *= lin
        mlp -= (1 - lin) * mlp / (3 if gated else 2)          # the activation output feeds the down projection
        if "moe" not in mods:
            act = 0.0 if "moe_act" in mods else st.sum(prof, "act_moe_act")
            moe -= (1 - lin) * (st.sum(prof, "act_moe_io") + st.sum(prof, "act_moe_latent") / 2 + act)
    kept = (norm_in + norm_out) / sp_div + (qkv + attn_out + mlp + shared + moe) / tp_div
    # Selective recompute re-materialises, during one layer's backward, only what that layer dropped.
    return kept, (where(full_layers > kept, full_layers - kept, 0.0) / max(n, 1) if mods else 0.0)


def held_zero_stage(st: Stage, L: Layout, tr: TrainingSpec):
    """The ZeRO stage whose bytes a GPU of the stage holds: ``L.zero_stage``, except under PP with ``pp_fsdp``
    per_step, where FSDP keeps parameters gathered and gradients unsharded all step: ZeRO-1 (module docstring).
    ``L.zero_stage`` may be a numpy array (elementwise result)."""
    if st.pp > 1 and tr.pp_fsdp == "per_step":
        return where(L.zero_stage >= 2, 1, L.zero_stage)
    return L.zero_stage


# The Layout fields the model-state terms read (stage_params: tp, ep, etp; shard_groups: dp, cp, hsdp_shard and
# edp, which is dp·tp·cp / (ep·etp); held_zero_stage: zero_stage): the key, with the function's name, of their memos
# in the stage. A term that comes to read another field must add it here (tests/cost/test_estimator_cache.py checks
# a key without any one of them fails).
STATE_FIELDS = ("tp", "ep", "etp", "dp", "cp", "hsdp_shard", "zero_stage")
_state_key = operator.attrgetter(*STATE_FIELDS)
# buffer_bytes reads these and the micro-batch (the gathered SP/TP input, the MoE dispatch buffers)
BUFFER_FIELDS = STATE_FIELDS + ("micro_batch",)
_buffer_key = operator.attrgetter(*BUFFER_FIELDS)


def _state_memoised(name: str, key, price, prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec):
    """``price(prof, st, L, tr)``, kept in the stage's memo under (name, ``key(L)``: the fields ``price`` reads,
    :data:`STATE_FIELDS` or :data:`BUFFER_FIELDS`) when those are plain values and ``tr`` is the stage's own
    training spec (the profile's); priced afresh otherwise (the search's grids hold numpy arrays)."""
    if tr is not prof.training:
        return price(prof, st, L, tr)
    return memoised(st.memo, name, key(L), price, prof, st, L, tr)


def model_state_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes on one GPU of the stage, after ZeRO sharding.
    ``L.zero_stage`` and the degrees may be broadcastable numpy arrays (elementwise result). Kept in the stage's memo
    (:func:`_state_memoised`)."""
    return _state_memoised("model_state_bytes", _state_key, _model_state_bytes, prof, st, L, tr)


def _model_state_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> tuple[float, float, float]:
    """:func:`model_state_bytes`, priced: reads only the fields in :data:`STATE_FIELDS` of ``L``."""
    dense, expert = stage_params(prof, st, L)
    sd, se = shard_groups(L)
    z = held_zero_stage(st, L, tr)
    w = tr.weight_bytes * (dense / where(z >= 3, sd, 1) + expert / where(z >= 3, se, 1))
    if tr.dp_impl == "fsdp2":   # FSDP2's shard is the fp32 master, counted in o (module docstring)
        w = where(z >= 3, 0.0, w)
    g = tr.grad_bytes * (dense / where(z >= 2, sd, 1) + expert / where(z >= 2, se, 1))
    o = tr.optimizer_bytes * (dense / where(z >= 1, sd, 1) + expert / where(z >= 1, se, 1))
    return w, g, o


# Bytes per logit element the loss kernel holds beside the logits (module docstring, Logits). 'te': Megatron's
# cross_entropy_fusion_impl 'te' (language_module.py compute_language_model_loss -> te_parallel_cross_entropy,
# Megatron-LM@d98e8a64) runs Transformer Engine's Triton parallel_cross_entropy, which before TE v2.18 writes the
# logit gradient in place into its bf16 input and saves that tensor for the backward
# (NVIDIA/TransformerEngine@71bbefbf, the TE of Megatron-Bridge v0.4.0 / NeMo 26.04, and @4220403e, Bridge v0.5.0 /
# 26.06: transformer_engine/pytorch/triton/cross_entropy.py ``cross_entropy_forward`` returns ``loss, _input``;
# cross_entropy.py ``ctx.save_for_backward(inp.detach())``): 0 B beyond the logits. From TE v2.18
# (01bbe3eea, 2026-07-09, "Fix the numerical issue with the Fused CE loss") it writes an fp32 gradient beside them
# (``torch.empty_like(_input, dtype=torch.float32)``): 4 B, as 'fused' counts.
LOGIT_EXTRA_BYTES = {"fused": 4, "te": 0, "unfused": 12}
# Stored per routed copy's width, in activation-dtype elements, by where the routing probabilities multiply the routed
# tokens (TrainingSpec.moe_weighting). 'activation': Megatron-Core applies them inside the expert activation
# (autopar.blocks.moe.MoE.stored): nothing beyond the blocks' tensors. 'fp32_multiply': torchtitan's MoE.forward
# (pytorch/torchtitan@0adca686 torchtitan/models/moe.py) computes ``(routed_input.to(torch.float32) *
# top_scores_experts_sorted.reshape(-1, 1)).to(x.dtype)`` before the experts (score_before_experts, the MoEArgs
# default) or the same on routed_output after them (the Qwen3 and DeepSeek-V3 configs): autograd's mul saves the fp32
# operand for the scores' gradient, 4 B per element of the k routed copies = 2 two-byte elements (the scatter_add
# combine keeps nothing).
MOE_WEIGHTING_ELEMS = {"activation": 0.0, "fp32_multiply": 2.0}
# PyTorch's loss path (TrainingSpec.loss_runtime 'torch', module docstring): bytes per logit element alive at the loss
# phase's peak, without TP (ATen log_softmax) and with TP (DTensor loss_parallel's decomposition), eager (the fp32
# temporaries at the backward's peak, measured on one H200 with benchmarks/torch_sac_memory.py and again on the CPU with
# benchmarks/torch_compiled_loss_memory.py) and torch.compile'd (cross_entropy 'compiled': the larger of the forward's
# and the backward's peak, benchmarks/torch_compiled_loss_memory.py on the CPU, 2026-11-26; APPROXIMATE on CUDA)
TORCH_LOSS_BYTES = {"eager": {"plain": 12, "loss_parallel": 16}, "compiled": {"plain": 4, "loss_parallel": 10}}
TORCH_FINAL_NORM_BYTES = 6   # eager final RMSNorm: fp32 upcast (4 B) + bf16 normalised output (2 B) per element


def logit_bytes_per_element(tr: TrainingSpec) -> float:
    """Bytes per element of one micro-batch's vocab-parallel logits on the last stage under Megatron's loss path
    (module docstring, Logits): the logits (activation dtype) and the loss kernel's :data:`LOGIT_EXTRA_BYTES`, held
    through the loss backward beside the layers' activations. PyTorch's path (``loss_runtime`` 'torch') has a phase
    of its own, :func:`torch_loss_bytes` (:func:`activation_bytes`)."""
    return tr.activation_bytes + LOGIT_EXTRA_BYTES[tr.cross_entropy]


def torch_loss_bytes(L: Layout, tr: TrainingSpec, pp: int = 1):
    """Bytes per logit element at PyTorch's loss peak, as the caching allocator holds them (module docstring): the
    tensors alive (:data:`TORCH_LOSS_BYTES`) and, eager, the freed block of the bf16 logits (``activation_bytes``),
    cached but too small for the fp32 gradients that follow; compiled ('compiled'), no such block, and the measured
    peak holds the bf16 logits themselves (saved without TP, the forward's peak with TP), which under PP (``pp`` > 1)
    torch.distributed.pipelining keeps anyway (its ``output_chunks``, counted apart in :func:`activation_bytes`).
    ``L.tp`` may be a numpy array."""
    if tr.cross_entropy == "compiled":
        alive = TORCH_LOSS_BYTES["compiled"]
        return where(L.tp > 1, alive["loss_parallel"], alive["plain"]) - (tr.activation_bytes if pp > 1 else 0)
    alive = TORCH_LOSS_BYTES["eager"]
    return where(L.tp > 1, alive["loss_parallel"], alive["plain"]) + tr.activation_bytes


def activation_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec,
                     elems: tuple[float, float] | None = None) -> float:
    """Stored activations of the in-flight micro-batches (+ logits and MTP on the last stage).
    ``elems`` = activation_elems_per_token(prof, st, L, linear_input_scale(tr)) when the caller has it.
    ``L.micro_batch``, ``L.grad_accum``, ``L.vpp``, the degrees and the two ``elems`` (e.g. over recompute
    policies) may be broadcastable numpy arrays (elementwise result)."""
    mb_tokens = L.micro_batch * tr.seq_len
    e = tr.activation_bytes
    kept, working = elems if elems is not None else activation_elems_per_token(prof, st, L,
                                                                                 linear_input_scale(tr))
    f = L.offload_activations
    layers = inflight_layer_microbatches(st, L)
    if f:
        layers = (1 - f) * layers + f * resident_offload_layers(st)
    act = mb_tokens * e * kept * layers
    layer_phase = mb_tokens * e * working          # one layer's backward working set
    if (not isinstance(L.cp, int) or L.cp > 1) and st.sum(prof, "attn_layers"):
        # the CP ring's buffers in one attention layer (pure in cp, tp, micro-batch; none at CP 1)
        ring = torch_ring_backward_bytes if tr.cp_ring == "torch_allgather" else te_ring_bytes
        memo = st.memo if tr is prof.training else None
        layer_phase = layer_phase + memoised(memo, ring.__name__, (L.cp, L.tp, L.micro_batch), ring, prof, L, tr)
    if tr.dp_impl == "fsdp2":   # the block's unsharded gradients and the previous reduce-scatter input (docstring)
        layer_phase = layer_phase + fsdp2_backward_bytes(prof, st, L, tr)
    logits = mb_tokens / (L.cp * L.tp) * prof.vocab * (1 + prof.model.mtp_layers) if st.is_last else 0.0
    if tr.loss_runtime == "torch":   # PyTorch's runtime (docstring), per element of one sequence-sharded b·s·h tensor
        boundary = mb_tokens / (L.cp * where(L.sp, L.tp, 1)) * prof.hidden
        if st.is_last:   # the loss backward's peak (loss temporaries, the cached logits block, the final norm's saved
            # tensors) comes before any layer's backward: the larger of the two phases, not their sum (docstring)
            loss_phase = logits * torch_loss_bytes(L, tr, st.pp) + boundary * TORCH_FINAL_NORM_BYTES
            act = act + maximum(layer_phase, loss_phase) + logits * (e * L.grad_accum if st.pp > 1 else 0.0)
        else:
            act = act + layer_phase
        if st.pp > 1:   # torch.distributed.pipelining's stage buffers
            act = act + boundary * e * pipeline_boundary_tensors(st, L)
    else:
        act = act + layer_phase + logits * logit_bytes_per_element(tr)
    if st.is_last and prof.model.mtp_layers:  # MTP blocks: about one more layer of the last kind per in-flight mb
        mtp_layers = prof.model.mtp_layers * minimum(st.pp, L.grad_accum)
        act = act + mb_tokens * e * (kept / max(st.n_layers, 1)) * mtp_layers
    return act


def torch_ring_backward_bytes(prof: ModelProfile, L: Layout, tr: TrainingSpec):
    """Bytes PyTorch's all-gather ring attention (``cp_ring`` 'torch_allgather') holds inside one attention layer's
    backward beside that layer's working set, one micro-batch, CP > 1 (module docstring, Ring attention): the
    all-gathered K/V of the whole sequence (activation dtype), the fp32 dQ accumulator, three fp32 dK/dV buffers (the
    received one, its concatenation and the all-to-all's output) and the step's dQ, dK, dV from the flash backward
    (activation dtype). ``L.cp``, ``L.tp`` and ``L.micro_batch`` may be numpy arrays (elementwise result)."""
    e = tr.activation_bytes
    kv = L.micro_batch * tr.seq_len / L.cp * torch_ring_kv_elems(prof, L)   # K and V, every local query head's
    q, _ = ring_q_o_elems(prof, L, tr)
    held = L.cp * kv * e + TORCH_RING_FP32_BYTES * (q + 3 * kv) + e * (q + kv)
    return where(L.cp > 1, held, 0.0)


TORCH_RING_FP32_BYTES = 4   # the backward's accumulators and dK/dV messages are fp32 (convert_to_f32 defaults True)


def te_ring_bytes(prof: ModelProfile, L: Layout, tr: TrainingSpec):
    """Bytes Transformer Engine's p2p ring attention (``cp_ring`` 'te_p2p') holds inside one attention layer beyond
    that layer's own tensors, one micro-batch, CP > 1 (module docstring, Transformer Engine's ring attention): the
    larger of its forward's (every step's K/V receive buffer and output, the fp32 merged output and its cast) and its
    backward's (dQ buffer, the K/V-and-gradient send/receive pair, one step's dQ, dK, dV). ``L.micro_batch`` may be
    a numpy array (elementwise result); tp and cp are a mesh's plain degrees."""
    e = tr.activation_bytes
    # K and V as the ring passes them (Megatron-Core's KV heads, MLA's up-projected heads: Attention.ring_elems)
    kv = L.micro_batch * tr.seq_len / L.cp * prof.model.attention_block.ring_elems(L.tp)
    q, o = ring_q_o_elems(prof, L, tr)
    fwd = e * L.cp * (kv + o) + (TE_RING_MERGE_BYTES + e) * o
    bwd = e * (2.0 * q + 5.0 * kv)
    return where(L.cp > 1, maximum(fwd, bwd), 0.0)


TE_RING_MERGE_BYTES = 4     # the forward's output correction runs in fp32 ("out in torch.float32")


def pipeline_boundary_tensors(st: Stage, L: Layout):
    """Stage-boundary tensors torch.distributed.pipelining holds on this rank beyond the stored layer inputs (module
    docstring): gradient- and activation-receive buffers of every micro-batch and every micro-batch's stage output
    (``output_chunks`` on every stage, torch before pytorch/pytorch#153383). ``L.grad_accum`` and ``L.vpp`` may be
    numpy arrays (elementwise result)."""
    M, v = L.grad_accum, L.vpp
    c = inflight_layer_microbatches(st, L) * v
    grad = v * M - (M if st.is_last else 0)
    recv = maximum(v * M - (M if st.is_first else 0) - c, 0.0)
    out = v * M - (M if st.is_last else 0)      # the last stage's outputs are its logits (logit_bytes_per_element)
    return grad + recv + out


def resident_offload_layers(st: Stage) -> float:
    """With activation offloading: micro-batches' worth of the stage's layer activations left on the GPU,
    two layers of one micro-batch (double buffering), as a fraction of the stage's layers."""
    return min(2, st.n_layers) / max(st.n_layers, 1)


def offloaded_activation_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """Host-memory bytes of offloaded activations at the 1F1B peak (0 without offloading)."""
    if not L.offload_activations:
        return 0.0
    kept, _ = activation_elems_per_token(prof, st, L, linear_input_scale(tr))
    return L.offload_activations * L.micro_batch * tr.seq_len * tr.activation_bytes * kept * max(
        inflight_layer_microbatches(st, L) - resident_offload_layers(st), 0.0)


def buffer_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """Communication, FSDP-gather and FP8 weight-copy buffers. ``L.micro_batch``, ``L.zero_stage`` and the
    degrees may be broadcastable numpy arrays (elementwise result). Kept in the stage's memo under
    :data:`BUFFER_FIELDS` (:func:`_state_memoised`)."""
    return _state_memoised("buffer_bytes", _buffer_key, _buffer_bytes, prof, st, L, tr)


def _buffer_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """:func:`buffer_bytes`, priced: reads only the fields in :data:`BUFFER_FIELDS` of ``L``."""
    mb_tokens = L.micro_batch * tr.seq_len
    e, h = tr.activation_bytes, prof.hidden
    buf = mb_tokens / L.cp * h * e                      # gathered SP/TP input of one linear
    if tr.tp_comm_overlap and tr.tp_overlap_impl == "async_tp":   # symmetric-memory workspace (docstring)
        buf = buf + where(L.tp > 1, 2.0 * mb_tokens / (L.cp * L.tp) * h * e, 0.0)
    if prof.is_moe and st.sum(prof, "moe_layers"):
        buf += 2 * mb_tokens / (L.cp * L.tp) * prof.top_k * h * e
    dense, expert = stage_params(prof, st, L)
    per_layer = (dense + expert) / max(st.n_layers, 1)
    z = held_zero_stage(st, L, tr)
    if tr.dp_impl == "fsdp2":   # FSDP2, counted from torch's source (docstring): one gathered block, the root
        # module's parameters gathered all step and the all-gather stream's cached flat buffers; the block's
        # unsharded gradients and the fp32 reduce-scatter input belong to the layer phase (fsdp2_backward_bytes)
        buf = buf + where(z >= 3, tr.weight_bytes * fsdp2_block_params(prof, st, L) + fsdp2_root_bytes(prof, st, L, tr)
                          + fsdp2_all_gather_pool_bytes(prof, st, L, tr), 0.0)
    else:   # a gathered block, the prefetched one and one block's gradient
        buf = buf + where(z >= 3, per_layer * (2 * tr.weight_bytes + tr.grad_bytes), 0.0)
    if tr.precision in _FP8 and tr.fp8_recipe in TORCHAO_RECIPES:   # one layer's transient casts (docstring)
        buf = buf + FP8_WEIGHT_COPY_BYTES * per_layer
    elif tr.precision in _FP8 and not tr.fp8_primary_weights:   # FP8 weight copies, row-wise and column-wise
        # (docstring): 2 B per local parameter; with FP8 primary weights the weights themselves are those copies
        buf = buf + FP8_WEIGHT_COPY_BYTES * (dense + expert) / where(z >= 3, shard_groups(L)[0], 1)
    return buf


def fsdp2_root_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """Bytes of FSDP2's root-module parameters (token embedding on the first stage, output head on the last; the
    final norm's h parameters are left out) held unsharded for the whole step (module docstring): weight_bytes per
    parameter of this TP rank. ``L.tp`` may be a numpy array (elementwise result)."""
    return tr.weight_bytes * _root_params(prof, st) / L.tp


def fsdp2_all_gather_pool_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec):
    """Bytes FSDP2's all-gather copy-in stream keeps reserved for its flat all-gather outputs (module docstring, FSDP2's
    per-block buffers): the largest two consecutive units' flat outputs, weight_bytes per parameter of this TP rank,
    the root module's (the first gathered in the forward, where the stage has one) with the first block's, or two
    blocks'. None with a shard group of one rank (nothing to gather). The degrees may be numpy arrays."""
    block = fsdp2_block_params(prof, st, L)
    root = _root_params(prof, st) / L.tp
    return where(shard_groups(L)[0] > 1, tr.weight_bytes * (maximum(root, block) + block), 0.0)


def fsdp2_backward_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec):
    """Bytes FSDP2 holds in a layer's backward beyond the gathered block (module docstring, FSDP2's per-block
    buffers): that block's unsharded gradients in the parameter dtype (weight_bytes per parameter), the previous
    block's reduce-scatter input in the reduce dtype (grad_bytes per parameter), kept until this block's
    reduce-scatter is issued (not under PP with ``pp_fsdp`` per_step, where it replaces the accumulated fp32 gradients
    the gradient term counts), and, on the stage holding the output head, the head's unsharded gradient (the root
    module reduces only after the whole backward). The degrees may be numpy arrays (elementwise result)."""
    block = fsdp2_block_params(prof, st, L)
    head = prof.head_params / L.tp if st.is_last else 0.0
    # under PP with pp_fsdp per_step the gradients accumulate unsharded in fp32 (the gradient term); the last
    # micro-batch's reduce-scatter input takes their place rather than adding to them
    rs_input = 0.0 if (st.pp > 1 and tr.pp_fsdp == "per_step") else tr.grad_bytes * block
    return tr.weight_bytes * (block + head) + rs_input


def fsdp2_block_params(prof: ModelProfile, st: Stage, L: Layout):
    """Parameters of one FSDP2 unit (one block, torchtitan's per-TransformerBlock ``fully_shard``) on this TP rank: the
    stage's parameters less its root module's, over its layers (an average where layers differ)."""
    dense, expert = stage_params(prof, st, L)
    return (dense + expert - _root_params(prof, st) / L.tp) / max(st.n_layers, 1)


def _root_params(prof: ModelProfile, st: Stage) -> float:
    """Parameters of FSDP2's root module on this stage before TP: the token embedding on the first stage, the output
    head on the last (the final norm's h left out)."""
    return (prof.embedding_params if st.is_first else 0.0) + (prof.head_params if st.is_last else 0.0)


FP8_WEIGHT_COPY_BYTES = 2.0   # row-wise + column-wise FP8 copy of each weight (module docstring)
TORCHAO_RECIPES = ("tensorwise", "rowwise")   # TrainingSpec.fp8_recipe values run by torchao's Float8Linear


def step_grad_copy_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """Bytes of the fp32 gradient copy the optimizer step makes (module docstring): 4 B per parameter the rank
    updates when the gradient buffers are narrower than fp32 and the optimizer keeps fp32 master weights; ZeRO-3
    none. ``L.zero_stage`` and the degrees may be broadcastable numpy arrays (elementwise result). Kept in the stage's
    memo (:func:`_state_memoised`)."""
    return _state_memoised("step_grad_copy_bytes", _state_key, _step_grad_copy_bytes, prof, st, L, tr)


def _step_grad_copy_bytes(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """:func:`step_grad_copy_bytes`, priced: reads only the fields in :data:`STATE_FIELDS` of ``L``."""
    if tr.grad_bytes >= 4 or tr.master_weights_dtype != "fp32":
        return 0.0
    dense, expert = stage_params(prof, st, L)
    sd, se = shard_groups(L)
    z = held_zero_stage(st, L, tr)
    shard = dense / where(z >= 1, sd, 1) + expert / where(z >= 1, se, 1)
    return where(z >= 3, 0.0, 4.0 * shard)


def reserve_bytes(modeled: float, hw: HardwareSpec) -> float:
    """Framework reserve: hardware.reserve_gib plus hardware.fragmentation of the modelled bytes."""
    return hw.reserve_gib * GIB + hw.fragmentation * modeled


def stage_memory(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec) -> MemoryBreakdown:
    w, g, o = model_state_bytes(prof, st, L, tr)
    act = activation_bytes(prof, st, L, tr)
    buf = buffer_bytes(prof, st, L, tr)
    buf += max(0.0, step_grad_copy_bytes(prof, st, L, tr) - act - buf)   # the optimizer step's peak, if higher
    reserve = reserve_bytes(w + g + o + act + buf, hw)
    return MemoryBreakdown(w / GIB, g / GIB, o / GIB, act / GIB, buf / GIB, reserve / GIB)
