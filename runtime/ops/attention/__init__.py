from salactl.runtime.ops.attention.reference import attention

__all__ = ["attention"]
