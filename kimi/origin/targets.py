"""Which targets can feed an EAGLE-3 drafter, and where a multimodal target keeps its image token id.

The origin line's vLLM decides EAGLE-3 target support with a list of ``model_type``
substrings (``llama``, ``qwen``, ...), so ``kimi_k2`` / ``kimi_k25`` /
``deepseek_v3`` targets are refused even once their model classes provide
the aux hidden states; and the drafter reads the image token id from
``config.image_token_index`` unless the class is on a second list, so
Kimi-K2.5 (``media_placeholder_token_id``) fails with an AttributeError after
its weights have loaded.  Here both questions are answered from the target
itself: its model class (resolved through vLLM's model registry) and its
config.

Hooks: ``SpeculativeConfig._verify_args`` calls ``check_eagle3_target``;
``EagleProposer.load_model`` calls ``image_token_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Names of the image placeholder token id seen in multimodal configs, looked up in this order.
IMAGE_TOKEN_FIELDS = ("image_token_index", "image_token_id", "media_placeholder_token_id")
# Sub-configs searched after the top level.
NESTED_CONFIGS = ("vision_config", "text_config")
# Speculative methods that read the target's aux hidden states (extract_hidden_states from vLLM 0.17).
AUX_STATE_METHODS = ("eagle3", "extract_hidden_states")


class Eagle3TargetError(ValueError):
    """The target cannot serve an EAGLE-3 drafter; the message names the model class and the reason."""


def _field(config: Any, name: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def _token_id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def image_token_id(config: Any, model_name: str = "the target model") -> int:
    """The image placeholder token id of a multimodal target's config.

    Looks for ``image_token_index``, ``image_token_id`` and
    ``media_placeholder_token_id`` at the top level of ``config``, then in
    ``config.vision_config`` and ``config.text_config`` (objects or dicts);
    the first non-negative int wins.

    Args:
        config: the target's Hugging Face config (``target_model.config``).
        model_name: the target's model class name, for the error message.

    Returns:
        The token id (an int), e.g. 163605 for Kimi-K2.5's ``media_placeholder_token_id``.

    Raises:
        Eagle3TargetError: none of the fields holds a token id; the message
            names the model class and every place looked at.
    """
    places: list[tuple[str, Any]] = [("config", config)]
    places += [(f"config.{name}", sub) for name in NESTED_CONFIGS if (sub := _field(config, name)) is not None]
    for _, where in places:
        for name in IMAGE_TOKEN_FIELDS:
            if (found := _token_id(_field(where, name))) is not None:
                return found
    looked = ", ".join(f"{place}.{name}" for place, _ in places for name in IMAGE_TOKEN_FIELDS)
    raise Eagle3TargetError(
        f"EAGLE-3 with the multimodal target {model_name}: its config names no image token id "
        f"(looked at {looked}); the drafter needs it to mark image positions. Add the id to the "
        f"target's config.json under one of {', '.join(IMAGE_TOKEN_FIELDS)}."
    )


def check_eagle3_target(spec_config: Any) -> None:
    """Fail at configuration time when the target cannot give the aux hidden states the method needs.

    A target can when its model class implements vLLM's ``SupportsEagle3``
    interface (``set_aux_hidden_state_layers`` /
    ``get_eagle3_aux_hidden_state_layers``): the class is resolved through
    the target's model registry (``ModelConfig.registry``), as the model
    loader will resolve it, so a new architecture needs no list edit.  A
    multimodal target must also name its image token id (``image_token_id``).
    Nothing is checked unless ``spec_config.method`` is one of
    ``AUX_STATE_METHODS`` and a target model config is set.

    Args:
        spec_config: vLLM's ``SpeculativeConfig`` being validated.

    Raises:
        Eagle3TargetError: the target's model class does not implement
            ``SupportsEagle3`` (the message names the class, the
            architecture and the model type), or a multimodal target has no
            image token id.
    """
    target = getattr(spec_config, "target_model_config", None)
    method = getattr(spec_config, "method", None)
    if method not in AUX_STATE_METHODS or target is None:
        return
    from vllm.model_executor.models.interfaces import supports_eagle3, supports_multimodal

    model_cls, arch = target.registry.resolve_model_cls(target.architectures, target)
    if not supports_eagle3(model_cls):
        model_type = getattr(target.hf_text_config, "model_type", None)
        raise Eagle3TargetError(
            f"{method} needs auxiliary hidden states from the target, and the target model class "
            f"{model_cls.__name__} (architecture {arch}, model_type {model_type}) does not provide them: it does "
            f"not implement vLLM's SupportsEagle3 interface (set_aux_hidden_state_layers / "
            f"get_eagle3_aux_hidden_state_layers). Use a target whose class implements it, or another "
            f"speculative method."
        )
    if supports_multimodal(model_cls):
        image_token_id(target.hf_config, model_cls.__name__)
