"Cross-module checks of the installed package."
import hqkv, pytest
from hqkv.codec import list_codecs, get_codec, check_codec

def test_version():
    assert isinstance(hqkv.__version__, str) and hqkv.__version__.count(".") == 2

def test_unknown_format_lists_supported():
    with pytest.raises(ValueError, match="supported formats"):
        get_codec("fp4-nonsense")

@pytest.mark.parametrize("name", list_codecs())
def test_every_registered_codec_conforms(name):
    for d in (256,):
        kw = {"allow": True} if name == "tbq3" else {}
        assert check_codec(get_codec(name, head_dim=d, **kw))
