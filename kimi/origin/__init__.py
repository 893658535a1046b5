"""EAGLE-3 on DeepSeek-V2/V3, Kimi-K2 and Kimi-K2.5 targets inside vLLM (the origin line).

Reached from vLLM through small hook patches of ``kimi/lines/origin/patches``:

* ``targets.check_eagle3_target``: which targets can feed an EAGLE-3 drafter,
  decided by the target model class's interface (``SpeculativeConfig``);
* ``targets.image_token_id``: a multimodal target's image token id, whatever
  its config calls it (``EagleProposer.load_model`` and the config check);
* ``aux_states``: the ``SupportsEagle3`` methods of DeepSeek-V2/V3 and the
  delegation of multimodal wrappers (Kimi-K2.5) to their language model.

These modules import vLLM lazily or only from inside vLLM's own modules, so
``import kimi`` never needs vLLM.
"""
