"""The served schema is completed from the types the app registers, wherever they are defined,
and the route limits come from the fields that declare them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from litestar import Litestar, post
from msgspec import Struct

from server.limits import Limit, key_rules_of, length_limit, limits_of, value_limit
from server.openapi import complete_request_schemas, request_types
from server.routes.documents import DocumentsRequest
from server.routes.rerank import RerankRequest
from server.routes.search import SearchRequest

if TYPE_CHECKING:
    from litestar.openapi.spec import Schema


class Probe(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A body defined outside the server's own modules."""

    text: Annotated[str, length_limit("max_query_chars")]
    many: Annotated[list[str], length_limit("max_embed_inputs")] = []
    depth: Annotated[int, value_limit("max_top_k")] = 1


@post("/probe")
async def probe(data: Probe) -> None:
    return None


def test_a_body_defined_anywhere_is_completed_and_its_limits_found():
    app = Litestar(route_handlers=[probe])
    assert request_types(app) == [Probe]
    complete_request_schemas(app.openapi_schema, request_types(app))
    component: Schema = app.openapi_schema.components.schemas["Probe"]  # type: ignore[assignment]
    assert component.additional_properties is False
    assert limits_of(Probe) == (
        Limit("text", "chars", "max_query_chars"),
        Limit("many", "items", "max_embed_inputs"),
        Limit("depth", "value", "max_top_k"),
    )


def test_the_server_s_bodies_declare_their_limits_on_their_fields():
    assert Limit("top_k", "value", "max_top_k") in limits_of(SearchRequest)
    assert Limit("documents[]", "chars", "max_document_chars") in limits_of(RerankRequest)
    # A document given as an object: its text, one level down.
    assert Limit("documents[].text", "chars", "max_document_chars") in limits_of(RerankRequest)
    assert limits_of(DocumentsRequest) == (
        Limit("documents", "items", "max_ingest_documents"),
        Limit("documents[].text", "chars", "max_ingest_document_chars"),
    )


def test_search_declares_its_doc_id_rule_on_its_filter_field():
    assert key_rules_of(SearchRequest) == (("filter", "doc_id", "doc_id"),)


def test_every_body_the_server_takes_declares_a_route_limit(fake_services):
    from ragrank.settings import Settings
    from server import create_app

    bodies = request_types(create_app(Settings(), services=fake_services))
    assert len(bodies) >= 7
    unbounded = [kind.__name__ for kind in bodies if not limits_of(kind)]
    assert not unbounded, f"bodies with no route limit on any field: {unbounded}"
