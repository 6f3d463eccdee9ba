"""SGLang model classes for DFlash drafters, registered in SGLang's
`ModelRegistry` (under the published architecture names) by the plugin."""
