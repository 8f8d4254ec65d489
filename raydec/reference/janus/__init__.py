"""The reference Janus text-to-image model: its architecture and processor (:mod:`.model`), its
training recipe (:mod:`.settings`, :mod:`.codes`, :mod:`.vq`, :mod:`.lm`, :mod:`.checkpoint`,
:mod:`.train`) and its evaluation (:mod:`.evaluate`)."""
