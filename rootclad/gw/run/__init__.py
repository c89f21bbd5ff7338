"""``rootclad gw run``, the main job: configuration (:mod:`.config`), training
(:mod:`.train`), evaluation against the matched filter (:mod:`.evaluate`), the report
(:mod:`.report`) and the stages in order (:mod:`.pipeline`). See docs/gw_run.md."""
