"""SGLang <= 0.5.5, which has no forward hooks: a source patch and the hook it calls."""
