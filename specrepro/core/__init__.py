"""The algorithms, as the papers state them: logits processing and the accept/reject rules (sampling), KV-cache
operations, the chain decoding loop (decoding), token trees and their verification (trees), tree attention, and
Medusa heads with their decoding (medusa_heads, medusa).

Imports only from the layer below (theory, stats, files, models, data). Nothing here times, simulates or writes the
record.
"""
