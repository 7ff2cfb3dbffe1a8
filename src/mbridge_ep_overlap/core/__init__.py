"""The library core: rules, the engine that evaluates them, ``enable_ep_overlap`` and the
finalize-time enforcement. Modules here import Megatron-Bridge only inside the functions that need
it (``enforcement`` excepted: it subclasses MB's ``ConfigContainer``)."""
