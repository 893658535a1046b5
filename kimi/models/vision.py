"""A trained vision tower for the Kimi-K2.5 wrapper of the shipped pair's target.

The wrapper ``pair-k25`` reads images of one line of held-in standard-library code (a ``def`` header, rendered
in Pillow's built-in font) and the frozen target should then continue as it does after the same line as text.
The tower is trained by distillation through the frozen target (transformers' ``DeepseekV3ForCausalLM``): for
each snippet ``a`` the image prompt ``<|media_pad|>\\n`` (the image shows ``a``) is teacher-forced with the
target's own greedy continuation of the text prompt ``a\\n``, and the loss is the KL divergence from the
target's next-token distribution after the text prompt to the one after the image prompt, at each position of
the continuation. Only the tower and the projector learn; the set of snippets is fixed and small, so the tower
memorises these images (it does not learn to read).

The tower's two encoder blocks are kept the identity (their output projections ``wo`` and ``mlp.fc1`` are zero:
each residual branch adds 0), so the torch code here computes what vLLM's ``MoonViT3dPretrainedModel`` and
``KimiK25MultiModalProjector`` compute (``vllm/model_executor/models/kimi_k25_vit.py``) without reproducing its
2-D rotary attention: patch embedding (a 14 x 14 convolution on pixels scaled to [-1, 1], mean and std 0.5),
plus the learned 16 x 16 position table (a single frame adds no time embedding), the encoder's final layer
norm, the 2 x 2 merge (``tpool_patch_merger``: patches of a merged token side by side, row-major), the
projector's per-patch layer norm, linear, GELU (erf), linear. :func:`image_rows` is that computation.

Needs torch, numpy and Pillow (imported when called); training also needs transformers.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from kimi.models import kimi_k25
from kimi.models.kimi_k25 import MEDIA_TOKEN, VisionSpec

#: The image prompt: the image, then the newline that ends the line it shows.
IMAGE_PROMPT = f"{MEDIA_TOKEN}\n"
#: Image side in pixels: 16 x 16 patches of 14, the tower's position grid, no resizing.
SIDE = 224


@dataclass(frozen=True)
class VisionRecipe:
    """How the tower is trained (``kimi models train-vision``): seeded, minutes on 2 CPU cores."""

    snippets: int = 32
    continuation: int = 64
    steps: int = 2000
    batch: int = 16
    lr: float = 5e-3
    font_size: int = 20
    seed: int = 0


#: The wrapper's tower (``kimi.models.kimi_k25.VisionSpec``'s defaults) and the shipped tower's recipe.
VISION = VisionSpec()
RECIPE = VisionRecipe()


def snippets(count: int, min_chars: int = 16, max_chars: int = 60) -> list[str]:
    """``count`` distinct ``def`` header lines (top level, ``min_chars``..``max_chars`` long) of the held-in
    stdlib corpus (:func:`kimi.models.tokenizer.stdlib_corpus`, which the target was trained on), at most one per
    file, files visited at an even stride in sorted order. Deterministic for a Python version.

    Raises:
        KimiError: the corpus holds fewer such lines.
    """
    from kimi.errors import KimiError
    from kimi.models.tokenizer import stdlib_corpus

    files = stdlib_corpus().files
    stride = max(1, len(files) // (2 * count))
    found: list[str] = []
    for path in files[::stride] + files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if (line.startswith("def ") and line.endswith(":") and min_chars <= len(line) <= max_chars
                    and line not in found):
                found.append(line)
                break
        if len(found) == count:
            return found
    raise KimiError(f"the stdlib corpus holds {len(found)} def lines of {min_chars}-{max_chars} characters, "
                    f"{count} wanted: pass --snippets {len(found)} or fewer")


def render(text: str, font_size: int = VisionRecipe.font_size):
    """``text`` in black on a white 224 x 224 RGB image (PIL), Pillow's built-in font, wrapped at the width.

    An empty ``text`` gives the blank image (the control).
    """
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (SIDE, SIDE), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=font_size)
    rows, row = [], ""
    for ch in text:
        if draw.textlength(row + ch, font=font) > SIDE - 8:
            rows.append(row)
            row = ""
        row += ch
    rows.append(row)
    for i, line in enumerate(rows):
        draw.text((4, 4 + i * (font_size + 4)), line, fill="black", font=font)
    return image


def patches(images, vision: VisionSpec = VISION):
    """``[B, N, 3 * P * P]`` float32 pixel patches of 224 x 224 RGB images, as vLLM feeds the tower.

    Pixels scaled to [-1, 1] (mean and std 0.5); patches row-major over the grid; inside a patch, channel, row,
    column (the layout of the patch convolution's weight). N = (224 / P)^2 = 256 for P = 14.

    Raises:
        ValueError: an image is not 224 x 224.
    """
    import numpy as np
    import torch

    p, g = vision.patch, SIDE // vision.patch
    out = []
    for image in images:
        if image.size != (SIDE, SIDE):
            raise ValueError(f"image of {image.size}, {SIDE} x {SIDE} wanted")
        a = np.asarray(image.convert("RGB"), dtype=np.float32) / 127.5 - 1.0  # [224, 224, 3]
        a = a.reshape(g, p, g, p, 3).transpose(0, 2, 4, 1, 3).reshape(g * g, 3 * p * p)
        out.append(torch.from_numpy(np.ascontiguousarray(a)))
    return torch.stack(out)


def image_rows(tensors: dict, pixels, vision: VisionSpec = VISION):
    """The image rows the text model reads: ``[B, N / merge^2, H]`` float32 for ``pixels`` [B, N, 3 P P].

    ``tensors`` are the tower's and projector's (checkpoint names, any float dtype; computed in float32) with the
    encoder blocks the identity (:func:`identity_blocks`). Row-major over the merged grid, as vLLM orders them.
    """
    import torch.nn.functional as F

    t = {k: v.float() for k, v in tensors.items()}
    d, g, m = vision.hidden, SIDE // vision.patch, vision.merge
    x = pixels.float() @ t["vision_tower.patch_embed.proj.weight"].reshape(d, -1).T
    x = x + t["vision_tower.patch_embed.proj.bias"] + t["vision_tower.patch_embed.pos_emb.weight"].reshape(g * g, d)
    x = F.layer_norm(x, (d,), t["vision_tower.encoder.final_layernorm.weight"],
                     t["vision_tower.encoder.final_layernorm.bias"], eps=1e-5)
    x = F.layer_norm(x, (d,), t["mm_projector.pre_norm.weight"], t["mm_projector.pre_norm.bias"], eps=1e-5)
    b = x.shape[0]
    x = x.reshape(b, g // m, m, g // m, m, d).permute(0, 1, 3, 2, 4, 5).reshape(b, (g // m) ** 2, m * m * d)
    x = F.gelu(x @ t["mm_projector.proj.0.weight"].T + t["mm_projector.proj.0.bias"])
    return x @ t["mm_projector.proj.2.weight"].T + t["mm_projector.proj.2.bias"]


class _Identity:
    """A weight source for :func:`kimi.models.kimi_k25.encoder_blocks`: zero matrices, unit layer norms (bf16)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def matrix(self, rows: int, cols: int):
        return self.torch.zeros(rows, cols, dtype=self.torch.bfloat16)

    def norm(self, n: int):
        return self.torch.ones(n, dtype=self.torch.bfloat16)


def identity_blocks(vision: VisionSpec) -> dict:
    """The encoder blocks' tensors (bf16) with every weight and bias zero except the layer norms' weights (one):
    ``wo`` and ``mlp.fc1`` zero make each block return its input."""
    return kimi_k25.encoder_blocks(_Identity(), vision)


def initial_tensors(vision: VisionSpec, text_hidden: int, seed: int) -> dict:
    """The trained tensors before training (float32, seeded): small random patch convolution and projector,
    zero position table, unit layer norms."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    d, p, g, w = vision.hidden, vision.patch, vision.pos_emb, vision.merged

    def normal(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    return {"vision_tower.patch_embed.proj.weight": normal(d, 3, p, p, std=0.02),
            "vision_tower.patch_embed.proj.bias": torch.zeros(d),
            "vision_tower.patch_embed.pos_emb.weight": torch.zeros(g, g, d),
            "vision_tower.encoder.final_layernorm.weight": torch.ones(d),
            "vision_tower.encoder.final_layernorm.bias": torch.zeros(d),
            "mm_projector.pre_norm.weight": torch.ones(d), "mm_projector.pre_norm.bias": torch.zeros(d),
            "mm_projector.proj.0.weight": normal(w, w, std=w ** -0.5), "mm_projector.proj.0.bias": torch.zeros(w),
            "mm_projector.proj.2.weight": normal(text_hidden, w, std=0.02),
            "mm_projector.proj.2.bias": torch.zeros(text_hidden)}


@dataclass
class Batch:
    """The training examples: per snippet the image's pixels, the continuation and the teacher's log-probs."""

    pixels: object  # [S, N, 3 P P] float32
    prompt: list[int]  # the image prompt's ids, the placeholder once
    continuation: object  # [S, T] int64: the target's greedy continuation of each text prompt
    teacher: object  # [S, T, V] float32 log-probs after the text prompt (teacher-forced continuation)


def teacher_batch(target, tokenizer, texts: list[str], prompt: list[int], recipe: VisionRecipe) -> Batch:
    """Greedy continuations of ``texts`` (each + newline) by ``target`` (float32 transformers model) and its
    log-probs along them; the images of ``texts`` rendered; ``prompt`` the image prompt's ids."""
    import torch

    conts, teach = [], []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text + "\n").input_ids])
            for _ in range(recipe.continuation):
                nxt = target(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            cont = ids[0, -recipe.continuation:]
            logits = target(ids[:, :-1]).logits[0, -recipe.continuation:]
            conts.append(cont)
            teach.append(torch.log_softmax(logits.float(), -1))
    return Batch(patches([render(t, recipe.font_size) for t in texts]), prompt, torch.stack(conts),
                 torch.stack(teach))


def student_log_probs(target, tensors: dict, batch: Batch, index, media_id: int, vision: VisionSpec = VISION):
    """``[b, T, V]`` log-probs of the target along the continuation after the image prompt, for the snippets
    ``index``: the image rows (:func:`image_rows`) stand at the placeholder."""
    import torch

    embed = target.get_input_embeddings()
    rows = image_rows(tensors, batch.pixels[index], vision)
    at = batch.prompt.index(media_id)
    before = embed(torch.tensor(batch.prompt[:at], dtype=torch.long)).expand(len(index), -1, -1)
    after = embed(torch.cat([torch.tensor(batch.prompt[at + 1:], dtype=torch.long).expand(len(index), -1),
                             batch.continuation[index, :-1]], dim=1))
    hidden = target.model(inputs_embeds=torch.cat([before, rows, after], dim=1)).last_hidden_state
    t = batch.continuation.shape[1]
    return torch.log_softmax(target.lm_head(hidden[:, -t:]).float(), -1)


def kl(teacher, student):
    """Mean over positions of KL(teacher || student), both ``[..., V]`` log-probs."""
    return (teacher.exp() * (teacher - student)).sum(-1).mean()


def check_target(folder: Path) -> None:
    """Refuse a ``--target`` that is not a DeepSeek-V3 target folder, before any weight loads.

    Raises:
        KimiError: no such folder, no config.json / tokenizer.json / model.safetensors in it, or a config of
            another architecture (a drafter's, a pair's top folder).
    """
    from kimi.errors import KimiError

    folder = Path(folder)
    missing = [n for n in ("config.json", "tokenizer.json", "model.safetensors") if not (folder / n).is_file()]
    if missing:
        raise KimiError(f"{folder} is not a target folder (no {', '.join(missing)} there): pass the target of a "
                        "pair, for example models/pair/target")
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise KimiError(f"{folder}/config.json is not a readable config ({exc})") from None
    if "DeepseekV3ForCausalLM" not in architectures:
        raise KimiError(f"{folder} holds {architectures or 'no architecture'}, not a DeepseekV3ForCausalLM target: "
                        "pass the target of a pair, for example models/pair/target")


def train_vision(target_dir, recipe: VisionRecipe = RECIPE, vision: VisionSpec = VISION,
                 say=print) -> tuple[dict, dict]:
    """Train the tower and projector against the frozen target in ``target_dir`` (a DeepSeek-V3 folder).

    Returns:
        ``(tensors, record)``: every tower and projector tensor in bf16 under the checkpoint's names (identity
        blocks included), and ``{"snippets", "losses": [[step, kl]], "top1": the share of continuation
        positions where the image prompt's argmax is the teacher's token (bf16 weights), "kl_final",
        "kl_blank": KL with a blank image, "seconds"}``.

    Raises:
        KimiError: ``target_dir`` is not a target (:func:`check_target`), or the corpus holds fewer snippets than
            the recipe wants; both before the weights load.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_target(target_dir)
    texts = snippets(recipe.snippets)  # before the weights load: too many fails in a second
    began = time.monotonic()
    torch.manual_seed(recipe.seed)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    for param in target.parameters():
        param.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    media_id = tokenizer.convert_tokens_to_ids(tokenizer.pad_token)  # <|pad|>: <|media_pad|> in the wrapper
    prompt = tokenizer(IMAGE_PROMPT.replace(MEDIA_TOKEN, tokenizer.pad_token)).input_ids
    batch = teacher_batch(target, tokenizer, texts, prompt, recipe)
    say(f"teacher: {len(texts)} snippets, {recipe.continuation}-token continuations ({time.monotonic() - began:.0f} s)")
    tensors = {k: v.requires_grad_() for k, v in initial_tensors(vision, target.config.hidden_size,
                                                                  recipe.seed).items()}
    opt = torch.optim.Adam(tensors.values(), lr=recipe.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, recipe.lr, total_steps=recipe.steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(recipe.seed)
    losses = []
    for step in range(1, recipe.steps + 1):
        index = torch.randperm(len(texts), generator=gen)[:recipe.batch]
        loss = kl(batch.teacher[index], student_log_probs(target, tensors, batch, index, media_id, vision))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0 or step == 1:
            losses.append([step, round(loss.item(), 4)])
            say(f"step {step}/{recipe.steps}: kl {loss.item():.3f} ({time.monotonic() - began:.0f} s)")
    out = {k: v.detach().bfloat16() for k, v in tensors.items()}
    import sys

    record = {"snippets": texts, "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
              "torch_threads": torch.get_num_threads(), "losses": losses,
              "seconds_training": round(time.monotonic() - began, 1),
              **evaluate(target, out, batch, media_id, vision)}
    return {**out, **identity_blocks(vision)}, record


def evaluate(target, tensors: dict, batch: Batch, media_id: int, vision: VisionSpec = VISION) -> dict:
    """``{"kl_final", "top1", "kl_blank", "top1_blank"}`` of ``tensors`` on ``batch`` (teacher-forced, all snippets;
    the blank image's rows in place of every image for the ``_blank`` control)."""
    import torch

    index = torch.arange(batch.continuation.shape[0])
    blank = Batch(patches([render("")]).expand(len(index), -1, -1), batch.prompt, batch.continuation, batch.teacher)
    out = {}
    with torch.no_grad():
        for suffix, b in (("", batch), ("_blank", blank)):
            student = student_log_probs(target, tensors, b, index, media_id, vision)
            out[f"kl{suffix or '_final'}"] = round(float(kl(batch.teacher, student)), 4)
            out[f"top1{suffix}"] = round(float((student.argmax(-1) == batch.continuation).float().mean()), 4)
    return out
