"""Let ggml-vulkan build against Vulkan headers that lack VK_EXT_layer_settings (Debian 12 ships 1.3.239).

ggml-vulkan.cpp chains a VkLayerSettingsCreateInfoEXT into its instance, to turn on best-practice checks when the
validation layer is present. Older headers lack the type, so the build fails. This wraps that chaining in
`#ifdef VK_EXT_layer_settings` (defined by every header that has the type): with newer headers nothing changes,
with older ones the instance is created without it (validation layers unused, as in any release build).

python packaging/vulkan_headers.py SDIST_FOLDER     (the unpacked llama-cpp-python sdist; run again: no change)
"""

import sys
from pathlib import Path

GUARD = "#ifdef VK_EXT_layer_settings\n"
START = "    VkBool32 enable_best_practice = layer_settings;"
END = "&layer_setting_info);\n"
PLAIN = "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"


def patch(source: str) -> str:
    if GUARD in source:
        return source
    start = source.index(START)
    end = source.index(END, start) + len(END)
    return source[:start] + GUARD + source[start:end] + "#else\n" + PLAIN + "#endif\n" + source[end:]


if __name__ == "__main__":
    path = Path(sys.argv[1]) / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    path.write_text(patch(path.read_text()))
