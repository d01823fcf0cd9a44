"""Pretraining-sample builders: word2vec skip-gram (:mod:`datamill.pretrain.word2vec`) and BERT
(:mod:`datamill.pretrain.bert`). Submodules are imported on demand."""

__all__: list[str] = []
