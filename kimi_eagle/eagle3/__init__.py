"""EAGLE-3: hidden states, draft vocabulary, the drafter, training, export, speculative decoding and evaluation."""
