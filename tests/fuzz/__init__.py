"""Coverage-guided fuzzing (atheris) of the MRC packet parser, the frame parser and a NIC's receive path.

`tests.fuzz.targets` holds the targets (plain functions of one ``bytes`` input, raising on a broken
invariant), `tests.fuzz.run` drives them with atheris or replays files through them, and
``tests/fuzz/corpus/<target>/`` is the seed corpus: real packets of an impaired transfer
(``scripts/make_fuzz_corpus.py`` regenerates it). This package imports nothing of openmrc itself, so the
runner can install atheris' instrumentation before the code under test is loaded.
"""
