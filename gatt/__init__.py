"""Ghost Attention (GAtt): teach a chat model to keep a first-turn instruction for 20+ turns.

Importing `gatt` registers the library's attention with transformers under the name "gatt", so
any Hugging Face model can run on it: `AutoModelForCausalLM.from_pretrained(..., attn_implementation="gatt")`.
"""

from gatt.attention import MaskedMultiHeadAttention, masked_attention, register_with_transformers
from gatt.modeling import GattConfig, GattForCausalLM, GattModel

register_with_transformers("gatt")

__all__ = ["GattConfig", "GattForCausalLM", "GattModel", "MaskedMultiHeadAttention", "masked_attention"]
__version__ = "0.1.0"
