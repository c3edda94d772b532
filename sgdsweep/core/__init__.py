"""The bottom layer, which every stage may import and which imports none of them: a point's
identity (content hashes, stream keys), where things live and atomic writes, the noise-type
registry, and the detection of this machine's hardware."""
