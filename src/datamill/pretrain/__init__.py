"""Pretraining-sample builders: word2vec skip-gram (:mod:`datamill.pretrain.word2vec`) and BERT
(:mod:`datamill.pretrain.bert`), each a subpackage with its ``cli`` and ``demo`` modules;
:mod:`datamill.pretrain.sources` registers their outputs as sources. Submodules are imported on
demand."""

__all__: list[str] = []
