"""Integrations: the torch custom operators (torch.compile), DTensor and FSDP2."""
