"""Robot planning on top of the runtime: world + skills files -> per-request schema -> grammar-
constrained (speculative) decoding -> jsonschema + safety gate -> plan, or a report
(`thor plan`)."""
