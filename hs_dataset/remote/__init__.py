"""Datasets in object storage: any fsspec URL (``s3://``, ``gs://``, ``hf://``, ``file://``) as a destination and a source.

One concept per module: :mod:`.location` (a URL -> its filesystem, or one refusal line),
:mod:`.transfer` (upload and download with the shard hash checked on the bytes that
moved), :mod:`.cache` (the bounded local cache of verified shards), :mod:`.prefetch`
(shards fetched ahead of the reader), :mod:`.header` (a remote shard's header and
offsets by ranged reads), :mod:`.dataset` (``open_dataset`` for URLs),
:mod:`.publish` (a locally written dataset uploaded, manifest last), :mod:`.destination`
(``build --out URL``: stage locally, upload as shards publish), :mod:`.merge` (parts merged
by manifest alone) and :mod:`.verify`. docs/REMOTE.md describes what works.
"""
