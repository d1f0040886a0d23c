"""Token masks: the vocabulary, its trie, the mask engine and the per-request matcher.

The only layer that knows both a grammar and a vocabulary."""
