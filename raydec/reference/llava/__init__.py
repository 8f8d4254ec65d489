"""The reference LLaVA VLM (captioner): its architecture and processor (:mod:`.model`), data
(:mod:`.data`), training (:mod:`.train`, :mod:`.refine`, :mod:`.command`), evaluation
(:mod:`.evaluate`), model card (:mod:`.card`), and the command that trains its ViSpec and
EAGLE drafts (:mod:`.draft_command`)."""
