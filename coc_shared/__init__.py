"""Neutral ground shared by the reference (``coc_impl``) and the judge (``conformance``).

It imports neither: the Megatron harness (``coc_shared.megatron``, the one
package that talks to megatron-core), the pipeline cost model and timeline, and the timing harness.
"""
