"""packaging/vulkan_headers.py, on the lines of llama-cpp-python 0.3.36's ggml-vulkan.cpp it rewrites (kept in
tests/data): Debian 12's Vulkan headers lack VK_EXT_layer_settings, and packaging/vulkan_check.sh builds with them."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vulkan_headers", ROOT / "packaging" / "vulkan_headers.py")
vulkan_headers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vulkan_headers)
ORIGINAL = (ROOT / "tests" / "data" / "ggml_vulkan_instance.cpp").read_text()


def test_the_layer_settings_are_used_only_where_the_headers_have_them():
    patched = vulkan_headers.patch(ORIGINAL)
    guarded, plain = patched.split("#else\n")
    assert guarded.startswith("#ifdef VK_EXT_layer_settings\n") and "LayerSettingsCreateInfoEXT" in guarded
    assert ORIGINAL in guarded  # with headers that have the type, the code is llama.cpp's own
    assert "LayerSetting" not in plain and plain.endswith("#endif\n")
    assert "instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);" in plain


def test_patching_twice_changes_nothing():
    once = vulkan_headers.patch(ORIGINAL)
    assert vulkan_headers.patch(once) == once


def test_a_llama_cpp_whose_code_moved_fails_loudly():
    with pytest.raises(ValueError):
        vulkan_headers.patch(ORIGINAL.replace("enable_best_practice", "best_practice"))
