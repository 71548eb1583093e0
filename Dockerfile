# muster's container image, for people with Docker or Podman. The same
# image builds without a container engine: scripts/build-image (CI checks
# that one with scripts/check-image).
#   docker build -t muster:v1.2.3 --build-arg VERSION=v1.2.3 .
# The pkcs11 variant (docs/hsm.md; PKCS11=1 scripts/build-image):
#   docker build --target pkcs11 -t muster:v1.2.3-pkcs11 --build-arg VERSION=v1.2.3 .
FROM golang:1.26 AS build
# The image sets GOTOOLCHAIN=local; auto builds with the patched release
# go.mod's toolchain line names when the image's Go is older.
ENV GOTOOLCHAIN=auto
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/muster-dev/muster/internal/cli.Version=${VERSION} -X github.com/muster-dev/muster/internal/cli.Commit=${COMMIT} -X github.com/muster-dev/muster/internal/cli.BuildDate=${BUILD_DATE}" \
      -o /out/muster ./cmd/muster \
 && mkdir -p /out/data /out/tmp && chmod 1777 /out/tmp

# The pkcs11 build (cgo, to dlopen PKCS#11 modules) and what it needs to
# run: glibc's loader and libraries from this stage's Debian, at their paths
# (scripts/pkcs11-runtime, which scripts/build-image uses too).
FROM build AS build-pkcs11
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
RUN CGO_ENABLED=1 go build -trimpath -buildvcs=false -tags pkcs11 \
      -ldflags "-s -w -X github.com/muster-dev/muster/internal/cli.Version=${VERSION} -X github.com/muster-dev/muster/internal/cli.Commit=${COMMIT} -X github.com/muster-dev/muster/internal/cli.BuildDate=${BUILD_DATE}" \
      -o /out/muster-pkcs11 ./cmd/muster \
 && scripts/pkcs11-runtime /out/muster-pkcs11 /runtime

# The pkcs11 variant: muster-pkcs11 with glibc, and no shell or other
# program. The vendor's module is mounted at run time (docs/hsm.md).
FROM scratch AS pkcs11
COPY --from=build-pkcs11 /runtime/ /
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build /out/tmp /tmp
COPY --from=build-pkcs11 /out/muster-pkcs11 /muster-pkcs11
COPY LICENSE /usr/share/doc/muster/LICENSE
USER 65532:65532
ENV MUSTER_LOG_FORMAT=json
WORKDIR /
ENTRYPOINT ["/muster-pkcs11"]
CMD ["--help"]

# The default image (the last stage: what a build without --target makes).
# Empty base: no shell, no libc, nothing to exec but muster.
FROM scratch AS static
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build /out/tmp /tmp
COPY --from=build /out/muster /muster
COPY LICENSE /usr/share/doc/muster/LICENSE
USER 65532:65532
ENV MUSTER_LOG_FORMAT=json
WORKDIR /
# Probe with the binary itself (there is no curl), e.g. for an agent:
# HEALTHCHECK CMD ["/muster", "healthcheck", "--url", "http://127.0.0.1:9464/healthz"]
ENTRYPOINT ["/muster"]
CMD ["--help"]
