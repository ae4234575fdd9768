# kvrouter container image: a static binary on a distroless base that
# carries CA certificates and runs as a non-root user (uid 65532).
#
#   docker build -t kvrouter:0.1.0 --build-arg VERSION=$(git describe --always --dirty) .
#   docker run --rm -p 8080:8080 -v $PWD/router.yaml:/etc/kvrouter/router.yaml kvrouter:0.1.0
#
# The build stage needs the Go module proxy (the toolchain named in go.mod
# is fetched through GOTOOLCHAIN).
FROM golang:1.26-bookworm AS build
ENV GOTOOLCHAIN=go1.27.3 CGO_ENABLED=0
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
RUN go build -trimpath -ldflags "-s -w -X main.buildVersionOverride=${VERSION}" -o /out/kvrouter ./cmd/kvrouter

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvrouter /usr/local/bin/kvrouter
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kvrouter"]
CMD ["serve", "--listen", ":8080", "--config", "/etc/kvrouter/router.yaml"]
