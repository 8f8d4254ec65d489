"""The reference VLM's small LLaVA assistant for Hugging Face's assisted generation: settings
(:mod:`.settings`), captions (:mod:`.data`), build and distillation (:mod:`.distill`),
measurement (:mod:`.measure`), model card (:mod:`.card`) and command line (:mod:`.command`)."""
